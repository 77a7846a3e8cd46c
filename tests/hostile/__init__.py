"""Hostile-input cases, split by module (see harness.py)."""
