"""Logging (and, later, metrics and health) for the worker."""
