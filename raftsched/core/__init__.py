"""The pure core: commands, apply, schedules, validation. No I/O, no clock."""
