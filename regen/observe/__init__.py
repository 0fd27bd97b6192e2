"""Observe: `regen status` and the report."""
