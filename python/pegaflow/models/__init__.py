"""Tiny local models for real-engine tests and ``make run`` (no model hub)."""
