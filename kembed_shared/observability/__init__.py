"""Logging, probes, the HTTP endpoint and fatal-error handling shared by every kembed process."""
