"""Finding a conversation's own events by their words: what a query asks for, how hits rank,
and how an agent reads them.

Both backends match the same way. A query becomes up to :data:`MAX_TERMS` words (stop words
and single letters dropped: they would match almost every event); the database tests each
against the text of every message of the conversation (its content, the names and arguments
of its tool calls, a tool result's output), with its own English stemming, so "failing"
finds "failed", and a longer word as a prefix too (:func:`prefix_forms`: "call" finds
"callback", "decide" finds "decision"). An identifier or a path is matched as a phrase of
its parts. Hits rank by the words they hold, each weighted by how rare it is in this
conversation (a word in every message tells nothing; :func:`rank_hits`), and among equals
the newest first: recall is for what a summary dropped, and the newest mention of a file or
error is the one that holds. Retracted messages and what a clear emptied from view are not
found; an erasure takes the events themselves.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from episodic.errors import ValidationError
from episodic.models import MessageEvent

#: The most words of one query that are matched (the rest are ignored).
MAX_TERMS = 16
#: The most hits one search returns.
MAX_SEARCH_LIMIT = 100
#: The longest query accepted, in characters.
MAX_QUERY_LENGTH = 2_000
#: How much of each hit an agent's tool shows, in characters.
HIT_EXCERPT_CHARS = 600
#: A word this long or longer also matches as a prefix of the words it is written in.
MIN_PREFIX_LENGTH = 4
#: A word this long or longer also matches as a prefix without its last two letters.
SHORT_PREFIX_FROM = 6

# A word: letters and digits, joined by the punctuation of identifiers and paths
# (test_auth.py, E-2147, src/app/models.py), so a file name is searched as a phrase.
_WORD = re.compile(r"[^\W_]+(?:[._/:\-][^\W_]+)*", re.UNICODE)

#: English words too common to tell one event from another. A short list: the databases'
#: English configurations drop their own on top of it.
STOP_WORDS = frozenset(
    """
    a about above after again all am an and any are as at be because been before being
    between both but by can could did do does doing done down during each few for from had has
    have having he her here hers him his how i if in into is it its itself just me more most my
    no nor not now of off on once only or other our out over own same she should so some such
    than that the their them then there these they this those through to too under until up
    us very was we were what when where which while who whom why will with would you your
    yours tell said say says
    """.split()  # noqa: SIM905 (a list of 130 quoted words reads worse)
)


#: what a query must hold: a character no regex engine takes for white space (Python's ``\s``
#: has the separators \x1c-\x1f and NEL, JSON Schema's ECMAScript ``\s`` has the BOM and
#: neither; the HTTP API's schema states this same pattern, so what it admits is searched)
QUERY_PATTERN = r"[^\s\x1c-\x1f\x85\ufeff]"


def query_terms(query: str) -> tuple[str, ...]:
    """The words ``query`` is matched by: lower-cased, stop words and repeats dropped, at most
    :data:`MAX_TERMS`. Empty when the query holds nothing but stop words (it then finds
    nothing). Raises :class:`ValidationError` for a query that is not text, is blank or is
    longer than :data:`MAX_QUERY_LENGTH`."""
    if not isinstance(query, str) or not re.search(QUERY_PATTERN, query):
        raise ValidationError("the search query must be non-empty text", field="q")
    if len(query) > MAX_QUERY_LENGTH:
        raise ValidationError(
            f"the search query is {len(query)} characters; at most {MAX_QUERY_LENGTH} are "
            "searched (use a few distinctive words: an error code, a file name)",
            field="q",
        )
    terms: list[str] = []
    for match in _WORD.finditer(query.lower()):
        word = match.group()
        if len(word) > 1 and word not in STOP_WORDS and word not in terms:
            terms.append(word)
    return tuple(terms[:MAX_TERMS])


def prefix_forms(term: str) -> tuple[str, ...]:
    """The prefixes ``term`` matches as (each stemmed by the database first), or none for a
    term matched as written: a word (no identifier's or path's parts) of
    :data:`MIN_PREFIX_LENGTH` letters or more is a prefix, and one of
    :data:`SHORT_PREFIX_FROM` or more also without its last two letters (stemming alone
    does not take "decide" to "decision")."""
    if len(term) < MIN_PREFIX_LENGTH or not term.isalnum():
        return ()
    if len(term) < SHORT_PREFIX_FROM:
        return (term,)
    return (term, term[:-2])


def rank_hits(hits: Iterable[tuple[int, int]], documents: int, limit: int) -> list[int]:
    """The seqs of the best ``limit`` messages, from ``(seq, term index)`` pairs (each term a
    message holds) among ``documents`` messages searched: each message scores the weights of
    the terms it holds, a term's weight ``ln((documents + 1) / messages holding it)`` (the
    rarer, the more it tells); ties go to the newest. PostgreSQL ranks in SQL the same way
    (postgres/queries.py, SEARCH_EVENTS)."""
    pairs = list(hits)
    holding = Counter(term for _, term in pairs)
    weight = {term: math.log((documents + 1) / count) for term, count in holding.items()}
    scores: dict[int, float] = defaultdict(float)
    for seq, term in pairs:
        scores[seq] += weight[term]
    return sorted(scores, key=lambda seq: (-round(scores[seq], 9), -seq))[:limit]


def check_search_limit(limit: object) -> None:
    """How many hits one search may ask for."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_SEARCH_LIMIT:
        raise ValidationError(
            f"limit must be between 1 and {MAX_SEARCH_LIMIT}, got {limit!r}", field="limit"
        )


def hit_text(hit: MessageEvent) -> str:
    """A hit's whole text as a model reads it: the message's text, then its tool calls."""
    message = hit.message
    calls = ", ".join(f"{call.name}({call.arguments_text()})" for call in message.tool_calls)
    if not calls:
        return message.text
    return f"{message.text}\n[calls {calls}]" if message.text else f"[calls {calls}]"


def excerpt(text: str, terms: Sequence[str], chars: int = HIT_EXCERPT_CHARS) -> str:
    """At most ``chars`` of ``text``, around the first place one of ``terms`` is written (a
    long tool output shows where it matched, not its first lines); "[...]" where cut. A
    term is looked for as written, then by its first letters (the databases match stems:
    "failing" finds "failed")."""
    if len(text) <= chars:
        return text
    lowered = text.lower()
    places = []
    for term in terms:
        for probe in (term, term[: max(4, len(term) - 3)]):
            at = lowered.find(probe)
            if at >= 0:
                places.append(at)
                break
    start = max(0, min(places) - chars // 4) if places else 0
    end = min(len(text), start + chars)
    start = max(0, end - chars)
    return f"{'[...] ' if start else ''}{text[start:end]}{' [...]' if end < len(text) else ''}"


def render_hits(hits: Sequence[MessageEvent], query: str) -> str:
    """Hits as an agent reads them: one block per event, its seq, who wrote it (and the tool
    it called or answered) and :func:`excerpt` of its text around the query's words."""
    if not hits:
        return f"No earlier message of this conversation matches {query!r}."
    terms = query_terms(query)
    blocks = [f"{len(hits)} earlier message(s) match {query!r}, best match first:"]
    for hit in hits:
        message = hit.message
        who = f"{message.role} {message.name}" if message.name else message.role
        blocks.append(f"[seq {hit.seq}, {who}]\n{excerpt(hit_text(hit), terms)}")
    return "\n\n".join(blocks)
