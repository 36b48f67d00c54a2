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


def plot(results: list[StoreResult], path: Path, subtitle: str) -> None:
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

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    markers = "osD^v<>"
    for n, (label, xs, ys) in enumerate(series):
        ax.plot(xs, ys, marker=markers[n % len(markers)], linewidth=1.8, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("conversation length (messages)")
    ax.set_ylabel("load latency, median (ms)")
    ax.set_title("Loading a whole conversation vs its length\n" + subtitle, fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=9, loc="best")
    all_x = sorted({x for _, xs, _ in series for x in xs})
    if all_x:
        ax.set_xticks(all_x)
        ax.set_xticklabels([f"{x:,}" for x in all_x])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
