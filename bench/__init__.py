"""Benchmarks for episodic on PostgreSQL, side by side with raw asyncpg in one run.

Run ``python -m bench`` (``--quick`` for a 10k-event ceiling). Every figure is a measurement
printed and written to ``bench/RESULTS.md``; nothing here asserts on timings.
"""
