"""Proposers: being written."""
