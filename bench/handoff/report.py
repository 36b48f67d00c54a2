"""``HANDOFF.md``: every compactor by depth and probe kind, mean and spread over replicates;
a plot of recall against depth; and the raw measurements beside them as JSON."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.handoff.run import Measurement, RunResult
from bench.handoff.sessions import PROBE_KINDS
from episodic.compaction import DEFAULT_SUMMARY_PREFIX


def _pct(values: Sequence[float]) -> str:
    """``mean ± sd`` in percent over the replicates (sd 0 for one)."""
    if not values:
        return "–"
    mean = statistics.fmean(values) * 100
    spread = statistics.stdev(values) * 100 if len(values) > 1 else 0.0
    return f"{mean:.0f} ± {spread:.0f}"


def _chains(measurements: Iterable[Measurement]) -> dict[tuple[str, int], list[Measurement]]:
    """The measurements by (compactor, depth), one per replicate (a session and seed)."""
    found: dict[tuple[str, int], list[Measurement]] = defaultdict(list)
    for m in measurements:
        found[(m.compactor, m.depth)].append(m)
    return found


def _shares(
    ms: Iterable[Measurement], attribute: str, kinds: Sequence[str] = PROBE_KINDS
) -> list[float]:
    """Each measurement's share of ``kinds`` with ``attribute``; the answer scores only of
    the measurements whose model was asked."""
    answers = attribute in ("answered", "false_done", "answered_with_search")
    return [
        _share(m, attribute, kinds)
        for m in ms
        if (m.asked or not answers) and all(getattr(s, attribute) is not None for s in m.scores)
    ]


def _share(m: Measurement, attribute: str, kinds: Sequence[str] = PROBE_KINDS) -> float:
    scores = [s for s in m.scores if s.kind in kinds]
    return sum(getattr(s, attribute) for s in scores) / len(scores) if scores else 0.0


def overview(result: RunResult, compactors: Sequence[str], depths: Sequence[int]) -> list[str]:
    cells = _chains(result.measurements)
    lines = [
        "| compactor | depth | context recall % | answer recall % | false done "
        "| search recall@5 % | answer recall with search % "
        "| context tokens | seconds per compaction | replicates |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in compactors:
        for depth in depths:
            ms = cells.get((name, depth), [])
            if not ms:
                continue
            asked = [m for m in ms if m.asked]
            false_done = sum(s.false_done for m in asked for s in m.scores)
            traps = sum(s.kind == "planned_not_done" for m in asked for s in m.scores)
            tokens = [m.context_tokens for m in ms]
            seconds = [m.compact_seconds for m in ms]
            trapped = f"{false_done} of {traps}" if traps else "–"
            lines.append(
                f"| {name} | {depth} | {_pct(_shares(ms, 'in_context'))} "
                f"| {_pct(_shares(ms, 'answered'))} | {trapped} "
                f"| {_pct(_shares(ms, 'searched'))} | {_pct(_shares(ms, 'answered_with_search'))} "
                f"| {statistics.fmean(tokens):,.0f} ± {statistics.pstdev(tokens):,.0f} "
                f"| {statistics.fmean(seconds):.1f} | {len(ms)} |"
            )
    return lines


def by_kind(result: RunResult, compactors: Sequence[str], depth: int, attribute: str) -> list[str]:
    cells = _chains(result.measurements)
    lines = [
        "| compactor | " + " | ".join(k.replace("_", " ") for k in PROBE_KINDS) + " |",
        "|---|" + "---:|" * len(PROBE_KINDS),
    ]
    for name in compactors:
        ms = cells.get((name, depth), [])
        if not ms:
            continue
        row = [_pct(_shares(ms, attribute, (kind,))) for kind in PROBE_KINDS]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return lines


def losses(result: RunResult, summarizers: Sequence[str], depth: int) -> list[str]:
    """Per probe kind at ``depth``: the compactor with a model that keeps it least (then
    answers it least), and the start of one handoff of its that lost it, for quoting."""
    cells = _chains(result.measurements)
    lines = [
        "| probe kind | kept least by | in context % | answered % | kept most by | its handoff, "
        "where the fact was lost |",
        "|---|---|---:|---:|---|---|",
    ]
    for kind in PROBE_KINDS:
        ranked = []
        for name in summarizers:
            ms = cells.get((name, depth), [])
            if ms:
                held = statistics.fmean(_shares(ms, "in_context", (kind,)))
                said = statistics.fmean(_shares(ms, "answered", (kind,)) or [0.0])
                ranked.append((held, said, name, ms))
        if not ranked:
            continue
        ranked.sort(key=lambda r: (r[0], r[1]))
        held, said, worst, ms = ranked[0]
        best = ranked[-1][2] if ranked[-1][:2] > (held, said) else "(all alike)"
        lost = next((m for m in ms for s in m.scores if s.kind == kind and not s.in_context), None)
        quote = _quote(lost.head) if lost is not None else "(kept in every replicate)"
        lines.append(
            f"| {kind.replace('_', ' ')} | {worst} | {held * 100:.0f} | {said * 100:.0f} "
            f"| {best} | {quote} |"
        )
    return lines


def _quote(text: str, limit: int = 360) -> str:
    """The handoff's start, on one line, after episodic's fixed prefix (the same in all)."""
    flat = " ".join(text.removeprefix(DEFAULT_SUMMARY_PREFIX).split()).replace("|", "\\|")
    return f"“{flat[:limit]}{'...' if len(flat) > limit else ''}”"


def plot(result: RunResult, compactors: Sequence[str], depths: Sequence[int], path: Path) -> bool:
    """Recall against depth per compactor (context and answer recall side by side); False
    when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cells = _chains(result.measurements)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, attribute, title in (
        (axes[0], "in_context", "context recall (key in the context)"),
        (axes[1], "answered", "answer recall (the model answers it)"),
    ):
        for name in compactors:
            xs = [d for d in depths if _shares(cells.get((name, d), []), attribute)]
            if not xs:
                continue
            ys = [statistics.fmean(_shares(cells[(name, d)], attribute)) * 100 for d in xs]
            axis.plot(xs, ys, marker="o", label=name)
        axis.set_xscale("log", base=2)
        axis.set_xticks(list(depths), [str(d) for d in depths])
        axis.set_xlabel("successive compactions")
        axis.set_title(title)
        axis.set_ylim(-5, 105)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("% of probes")
    axes[1].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def markdown(
    result: RunResult,
    *,
    compactors: Sequence[tuple[str, str]],
    depths: Sequence[int],
    facts: Sequence[str],
    plot_name: str | None,
    summarizers: Sequence[str] = (),
) -> str:
    """The report; ``summarizers`` are the compactors that call the model (the section on
    where each probe kind is lost compares those)."""
    names = [name for name, _ in compactors if name not in result.skipped]
    lines = [
        "# What survives a compaction",
        "",
        "Generated by `python -m bench.handoff` (see `bench/handoff/`); the raw measurements "
        "are in the JSON file beside this one. Each chain is one generated session under one "
        "compactor, compacted after every phase from the second on; depth d is the d-th "
        "compaction in a row. Scores are computed by code from the context and the model's "
        "answers (`bench/handoff/scoring.py`); the model never grades itself. Mean ± standard "
        "deviation over the replicates (each a session of its kind with another seed).",
        "",
        *facts,
        "",
        "## Compactors",
        "",
        *[f"- `{name}`: {what}" for name, what in compactors if name not in result.skipped],
        *[f"- `{name}`: skipped: {why}" for name, why in result.skipped.items()],
        "- OpenAI Agents SDK's `OpenAIResponsesCompactionSession`: not run; it calls the "
        "Responses API's server-side `responses.compact`, which no local OpenAI-compatible "
        "endpoint offers.",
        "",
    ]
    if result.failures:
        lines += ["## Chains that failed", ""]
        lines += [f"- `{c}` {kind} seed {seed}: {why}" for c, kind, seed, why in result.failures]
        lines += [""]
    lines += ["## By depth", "", *overview(result, names, depths), ""]
    claims = [
        s.record_claims_done
        for m in result.measurements
        for s in m.scores
        if s.record_claims_done is not None
    ]
    if claims:
        lines += [
            "False done in the derived sections: the tool record (read from the log) names the "
            f"work planned but not done in {sum(claims)} of the {len(claims)} handoffs measured "
            "that have one.",
            "",
        ]
    if plot_name:
        lines += [f"![recall against depth]({plot_name})", ""]
    deepest = max(depths)
    lost = losses(result, [n for n in names if n in summarizers], deepest)
    if len(lost) > 2:
        lines += [
            f"## Where each probe kind is lost, at depth {deepest}",
            "",
            "Among the compactors that call the model: which keeps each kind of fact least "
            "(ties: which answers it least), and the start of one of its handoffs that lost it.",
            "",
            *lost,
            "",
        ]
    cells = _chains(result.measurements)
    for depth in depths:
        lines += [
            f"## Depth {depth}, by probe kind",
            "",
            "Context recall % (the probe's answer is in the context):",
            "",
            *by_kind(result, names, depth, "in_context"),
            "",
            "Answer recall % (the model answers it; for planned-not-done, says it is not done):",
            "",
            *by_kind(result, names, depth, "answered"),
            "",
        ]
        searching = [n for n in names if _shares(cells.get((n, depth), []), "searched")]
        if searching:
            lines += [
                "Search recall@5 % (one of the five events a search for the question returns "
                "holds the answer):",
                "",
                *by_kind(result, searching, depth, "searched"),
                "",
                "Answer recall with search % (the model answers from the context and those "
                "five events):",
                "",
                *by_kind(result, searching, depth, "answered_with_search"),
                "",
            ]
    return "\n".join(lines) + "\n"
