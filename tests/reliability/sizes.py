"""Battery sizes: CI size by default, nightly size with ``EPISODIC_TEST_NIGHTLY=1``.

The conftest scrubs EPISODIC_* variables from each test's environment, so the switch is read
here, once, at import time.
"""

from __future__ import annotations

import os
import random

NIGHTLY = os.environ.get("EPISODIC_TEST_NIGHTLY") == "1"


def size(ci: int, nightly: int) -> int:
    """The figure for this run: ``ci`` in the normal suite, ``nightly`` when asked for."""
    return nightly if NIGHTLY else ci


def seeds(ci: int, nightly: int) -> list[int]:
    """Seeds to run a randomized scenario with (fixed, so a failure can be replayed)."""
    return list(range(1, size(ci, nightly) + 1))


def seeded(seed: int) -> random.Random:
    """A generator for one scenario; print the seed in assertion messages."""
    return random.Random(seed)
