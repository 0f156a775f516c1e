"""Shared fakes for the unit tests."""
