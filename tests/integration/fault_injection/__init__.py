"""Fault injection for the worker processes of ``tests/integration/test_batch_failures.py``.

This folder goes on the PYTHONPATH of one test's worker process only, so that Python runs
``sitecustomize`` at that process's start. ``marker`` holds what the test and the wrapper
share, and has no side effects.
"""
