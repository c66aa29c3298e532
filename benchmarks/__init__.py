"""Measured comparisons, not timed tests: ``nox -s bench`` or ``python -m benchmarks [NAME ...]``."""
