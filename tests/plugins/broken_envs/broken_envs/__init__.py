"""Declares entry points that do not work."""
