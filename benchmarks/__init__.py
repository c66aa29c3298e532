"""Measured comparisons, not timed tests.

Run with ``nox -s bench`` or ``python -m benchmarks [NAME ...]``.
"""
