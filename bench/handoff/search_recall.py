"""``python -m bench.handoff.search_recall``: search recall@5 without a model.

Whether a search for a probe's question finds the event that holds its answer depends on the
log and the search only, not on any summary: so it is measured here over many generated
sessions in seconds, on either backend (``--database-url``; a throwaway SQLite file by
default). The handoff benchmark reports the same figure for its chains, beside the model's
answers.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.handoff.run import SEARCH_HITS
from bench.handoff.scoring import holds
from bench.handoff.sessions import PROBE_KINDS, SESSION_KINDS, generate
from episodic import EpisodicStore
from episodic.search import hit_text

#: phases per session: the deepest chain of the handoff benchmark (depth 8) and its first
PHASES = 9


async def measure(
    url: str, seeds: Sequence[int], kinds: Sequence[str]
) -> Counter[tuple[str, str, bool]]:
    """(session kind, probe kind, found) -> probes, one session per kind and seed."""
    counts: Counter[tuple[str, str, bool]] = Counter()
    store = await EpisodicStore.open(url)
    try:
        await store.migrate()
        for kind in kinds:
            for seed in seeds:
                session = generate(kind, seed, PHASES)
                conversation = await store.create_conversation()
                for phase in session.phases:
                    await store.append(conversation, list(phase))
                    await store.mark_run_completed(conversation)
                for probe in session.probes:
                    hits = await store.search(conversation, probe.question, limit=SEARCH_HITS)
                    found = any(holds(hit_text(hit), probe.keys) for hit in hits)
                    counts[(kind, probe.kind, found)] += 1
    finally:
        await store.close()
    return counts


def report(counts: Counter[tuple[str, str, bool]], kinds: Sequence[str]) -> list[str]:
    """A table: recall@5 per session kind and probe kind, then overall."""
    lines = [
        f"| session | {' | '.join(k.replace('_', ' ') for k in PROBE_KINDS)} | all |",
        "|---|" + "---:|" * (len(PROBE_KINDS) + 1),
    ]
    for kind in (*kinds, "all"):
        cells = []
        for probe in (*PROBE_KINDS, "all"):
            found = sum(
                n
                for (k, p, hit), n in counts.items()
                if hit and kind in (k, "all") and probe in (p, "all")
            )
            total = sum(
                n for (k, p, _), n in counts.items() if kind in (k, "all") and probe in (p, "all")
            )
            cells.append(f"{found}/{total}" if total else "–")
        lines.append(f"| {kind} | {' | '.join(cells)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.handoff.search_recall")
    parser.add_argument("--database-url", help="a database to search in (default: SQLite)")
    parser.add_argument("--seeds", type=int, default=10, help="sessions per kind (default 10)")
    parser.add_argument("--kinds", nargs="+", choices=SESSION_KINDS, default=list(SESSION_KINDS))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="episodic-search-recall-") as scratch:
        url = args.database_url or f"sqlite+aiosqlite:///{Path(scratch) / 'recall.db'}"
        counts = asyncio.run(measure(url, range(1, args.seeds + 1), args.kinds))
    print(f"search recall@{SEARCH_HITS} for each probe's question, {args.seeds} seeds a kind:")
    print("\n".join(report(counts, args.kinds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
