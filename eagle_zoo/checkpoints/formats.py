"""Checkpoint formats: being written."""
