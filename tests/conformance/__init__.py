"""Runs of frameworks' own test suites against episodic's classes (see each run.py)."""
