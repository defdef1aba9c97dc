"""Catalog: being written."""
