"""Executors: how a run's target is called."""
