"""Splitting prose into sentences, the one way the handoff's parts do it.

The record detects a user's rules and what was said about reproducing a problem sentence by
sentence (:mod:`episodic.worklog`), and the notes cut the sentences that copy a carried line
(:mod:`episodic.notes`): both must agree on where a sentence ends, or a note's copy of a
detected rule would not be seen as one.
"""

from __future__ import annotations

import re

#: where a sentence ends: after . ! or ? and a space, but not after a title ("Dr. Okafor"),
#: or at a line break
_SENTENCE_END = re.compile(
    r"(?<=[.!?])(?<!\b[A-Z][a-z]\.)(?<!\b[A-Z][a-z]{2}\.)(?<!\b[A-Z][a-z]{3}\.)\s+|\s*\n\s*"
)


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` in order, stripped, empty ones left out."""
    return [part.strip() for part in _SENTENCE_END.split(text.strip()) if part.strip()]


__all__ = ["split_sentences"]
