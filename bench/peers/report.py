"""The peers' markdown report and the load-latency plot."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.peers.workloads import Appends, Concurrent, Loads

PEERS = ("openai_agents", "adk", "langgraph")
RAW = "raw"


@dataclass
class StoreResult:
    key: str
    label: str
    how: str
    per_call: int = 1
    status: str = "ok"  # "ok", or why it was skipped / stopped
    appends: Appends | None = None
    concurrent: Concurrent | None = None
    loads: Loads | None = None
    #: episodic only: loads behind a compaction boundary, by history length before it
    boundary: Loads | None = None
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)

    def load_ms(self, size: int) -> float | None:
        if self.loads is None:
            return None
        for p in self.loads.points:
            if p.size == size:
                return p.median_ms
        return None


@dataclass
class Figure:
    title: str
    unit: str
    higher_is_better: bool
    value: Callable[[StoreResult], float | None]


def figures(table_sizes: list[int], appends: int, tasks: int, convs: int) -> list[Figure]:
    out = [
        Figure(
            f"append, 1 conversation, {appends:,} sequential messages",
            "msg/s",
            True,
            lambda r: r.appends.per_second if r.appends else None,
        )
    ]
    for size in table_sizes:
        out.append(
            Figure(
                f"load whole conversation @{size:,} messages (median)",
                "ms",
                False,
                lambda r, s=size: r.load_ms(s),  # type: ignore[misc]
            )
        )
    out.append(
        Figure(
            f"concurrent appends, {tasks} tasks x {convs} conversations",
            "msg/s",
            True,
            lambda r: r.concurrent.per_second if r.concurrent else None,
        )
    )
    return out


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def baseline(fig: Figure, raws: list[StoreResult]) -> float | None:
    """Raw asyncpg's figure: the mean of its runs (first and last in the run)."""
    return _mean([fig.value(r) for r in raws])


def speed(fig: Figure, value: float | None, ref: float | None) -> float | None:
    """How many times as fast as ``ref`` (above 1 is faster), for throughput and latency."""
    if value is None or ref is None or value == 0 or ref == 0:
        return None
    return value / ref if fig.higher_is_better else ref / value


def fastest_peer(fig: Figure, results: list[StoreResult]) -> tuple[str, float] | None:
    vals = [(r.label, v) for r in results if r.key in PEERS and (v := fig.value(r)) is not None]
    if not vals:
        return None
    pick = max if fig.higher_is_better else min
    return pick(vals, key=lambda lv: lv[1])


def _fmt(v: float | None, unit: str) -> str:
    if v is None or math.isnan(v):
        return "—"
    if unit == "msg/s":
        return f"{v:,.0f}"
    return f"{v:,.1f}" if v >= 10 else f"{v:,.2f}"


def _ratio(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"


def _reached(r: StoreResult, fig: Figure, appends: int) -> str:
    if fig.unit == "msg/s" and fig.title.startswith("append") and r.appends:
        a = r.appends
        first, last = a.windows[0][1], a.windows[-1][1]
        note = f"{a.messages:,} msgs in {a.seconds:.1f} s"
        if a.capped:
            note += f" (time cap; {appends:,} not reached)"
        return note + f"; first window {first:,.0f} msg/s, last {last:,.0f} msg/s"
    if fig.title.startswith("concurrent") and r.concurrent:
        c = r.concurrent
        note = f"{c.messages:,} msgs in {c.seconds:.1f} s"
        return note + (f" (time cap; {c.target:,} not reached)" if c.capped else "")
    if fig.unit == "ms" and r.loads:
        size = int(fig.title.split("@")[1].split()[0].replace(",", ""))
        for p in r.loads.points:
            if p.size == size:
                return f"{p.loaded:,} messages returned, {len(p.samples)} calls"
        if r.loads.capped_before is not None and size >= r.loads.capped_before:
            return "not reached (time cap)"
    if r.status != "ok":
        return r.status
    return ""


def tables(results: list[StoreResult], figs: list[Figure], appends: int) -> tuple[str, str]:
    """A summary table (figures only) and the full one (figures, ratios, what was reached)."""
    raws = [r for r in results if r.key == RAW]
    shown = [raws[0], *[r for r in results if r.key != RAW]] if raws else results

    head = "| store | " + " | ".join(f"{f.title} ({f.unit})" for f in figs) + " |"
    lines = [head, "|---|" + "---:|" * len(figs)]
    for r in shown:
        cells = []
        for f in figs:
            v = baseline(f, raws) if r.key == RAW else f.value(r)
            cells.append(_fmt(v, f.unit))
        label = r.label + (f" ({r.status})" if r.status != "ok" else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    summary = "\n".join(lines)

    lines = [
        "| workload | store | value | unit | vs raw asyncpg | vs fastest peer | reached / note |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for f in figs:
        ref = baseline(f, raws)
        best = fastest_peer(f, results)
        for r in shown:
            v = ref if r.key == RAW else f.value(r)
            if r.key == RAW:
                runs = ", ".join(_fmt(f.value(x), f.unit) for x in raws)
                note = f"mean of {len(raws)} runs (first and last store of the run): {runs}"
            else:
                note = _reached(r, f, appends)
            lines.append(
                f"| {f.title} | {r.label} | {_fmt(v, f.unit)} | {f.unit} | "
                f"{_ratio(speed(f, v, ref))} | "
                f"{_ratio(speed(f, v, best[1] if best else None))} | {note} |"
            )
    return summary, "\n".join(lines)


def boundary_table(results: list[StoreResult], tail: int) -> str:
    """episodic's loads behind a boundary, by history length before it, next to the
    whole-history loads at the same length, and the longest over the shortest."""
    ep = next((r for r in results if r.key == "episodic"), None)
    if ep is None or ep.boundary is None or not ep.boundary.points:
        why = ep.status if ep is not None and ep.status != "ok" else "episodic did not run"
        return f"Not measured: {why}."
    raws = [r for r in results if r.key == RAW]
    points = ep.boundary.points
    first = points[0]
    lines = [
        "| history before the boundary (messages) | events in the log | messages returned "
        "| load_context behind the boundary, median (ms) | calls | latency vs "
        f"@{first.size:,} | episodic, whole history (ms) | behind the boundary vs whole history "
        "| raw asyncpg, whole history (ms) | fastest peer, whole history (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in points:
        whole = ep.load_ms(p.size)
        raw = _mean([r.load_ms(p.size) for r in raws])
        peers = [
            (r.label, v) for r in results if r.key in PEERS and (v := r.load_ms(p.size)) is not None
        ]
        best = min(peers, key=lambda lv: lv[1]) if peers else None
        whole_cell = _fmt(whole, "ms") if whole is not None else "— (not measured)"
        best_cell = f"{_fmt(best[1], 'ms')} ({best[0]})" if best else "—"
        lines.append(
            f"| {p.size:,} | {p.size + 1 + p.tail:,} | {p.loaded:,} | {_fmt(p.median_ms, 'ms')} | "
            f"{len(p.samples)} | {p.median_ms / first.median_ms:.2f} | {whole_cell} | "
            f"{_ratio(whole / p.median_ms) if whole else '—'} | {_fmt(raw, 'ms')} | "
            f"{best_cell} |"
        )
    last = points[-1]
    note = (
        f"Longest over shortest (@{last.size:,} over @{first.size:,} messages before the "
        f"boundary): **{last.median_ms / first.median_ms:.2f}** "
        f"({_fmt(last.median_ms, 'ms')} vs {_fmt(first.median_ms, 'ms')} ms; 1.00 = flat). "
        f"*events in the log* counts the messages, the boundary and the {tail}-message tail; "
        f"*messages returned* are the summary, the 2 retained user messages and the tail; "
        "*latency vs* is a latency ratio (above 1 is slower), *behind the boundary vs whole "
        "history* a speed ratio (above 1 is faster)."
    )
    if ep.boundary.capped_before is not None:
        note += (
            f" Lengths from {ep.boundary.capped_before:,} on were not reached (growth time cap)."
        )
    return "\n".join(lines) + "\n\n" + note


def plot(results: list[StoreResult], path: Path, subtitle: str, tail: int = 200) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullLocator

    raws = [r for r in results if r.key == RAW]
    series: list[tuple[str, list[int], list[float]]] = []
    if raws and raws[0].loads:
        sizes = [p.size for p in raws[0].loads.points]
        ms = [_mean([r.load_ms(s) for r in raws]) for s in sizes]
        series.append((raws[0].label, sizes, [m for m in ms if m is not None]))
    for r in results:
        if r.key != RAW and r.loads and r.loads.points:
            series.append(
                (r.label, [p.size for p in r.loads.points], [p.median_ms for p in r.loads.points])
            )

    fig, ax = plt.subplots(figsize=(9.5, 6), dpi=120)
    markers = "osD^v<>"
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    episodic_colour = None
    for n, (label, xs, ys) in enumerate(series):
        colour = colours[n % len(colours)]
        if label == next((r.label for r in results if r.key == "episodic"), None):
            episodic_colour = colour
        ax.plot(xs, ys, marker=markers[n % len(markers)], linewidth=1.8, color=colour, label=label)
    ep = next((r for r in results if r.key == "episodic" and r.boundary), None)
    behind: list[int] = []
    if ep is not None and ep.boundary is not None and ep.boundary.points:
        behind = [p.size for p in ep.boundary.points]
        behind_ms = [p.median_ms for p in ep.boundary.points]
        ax.plot(
            behind,
            behind_ms,
            color=episodic_colour or colours[len(series) % len(colours)],
            linestyle="--",
            linewidth=1.8,
            marker="s",
            markerfacecolor="white",
            label=f"episodic, behind a boundary ({tail}-message tail)",
        )
        for x, y in zip(behind, behind_ms, strict=True):
            ax.annotate(
                _fmt(y, "ms"),
                (x, y),
                textcoords="offset points",
                xytext=(0, 7),
                ha="center",
                va="bottom",
                fontsize=7.5,
                color=episodic_colour or "black",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
                zorder=5,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(
        "conversation length (messages); for the dashed line, messages before the boundary "
        f"(+ a {tail}-message tail)"
    )
    ax.set_ylabel("load latency, median (ms)")
    ax.set_title(
        "Loading a conversation vs its length: the whole history (solid lines),\n"
        "and episodic behind a compaction boundary (dashed)\n" + subtitle,
        fontsize=10.5,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8.5, loc="upper left")
    all_x = sorted({x for _, xs, _ in series for x in xs} | set(behind))
    if all_x:
        ax.set_xticks(all_x)
        ax.set_xticklabels([f"{x:,}" for x in all_x])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
