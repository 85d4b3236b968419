"""Harness for tests, chaos scripts and benchmarks: real local clusters."""
