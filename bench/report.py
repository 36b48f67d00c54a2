"""The markdown table: every figure, and its ratio to raw asyncpg or to the 1k-event case."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.provenance import run_facts
from bench.stats import Latency


@dataclass
class Row:
    workload: str
    msg_s: float | None = None
    latency: Latency | None = None
    note: str = ""
    vs_raw: float | None = None
    vs_1k: float | None = None


@dataclass
class Summary:
    """Headline ratios next to the targets of issue 14 (shown, never asserted)."""

    name: str
    value: float
    target: str
    met: bool


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    summary: list[Summary] = field(default_factory=list)
    #: raw asyncpg's sequential append rate, msg/s
    raw_rate: float = float("nan")

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row


def _num(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return ""
    return f"{value:,.{digits}f}"


def table(report: Report) -> str:
    """The headline ratios, then every figure they come from."""
    lines = ["| ratio | value | target (issue 14) | meets |", "|---|---:|---|---|"]
    for s in report.summary:
        lines.append(f"| {s.name} | {_num(s.value)} | {s.target} | {'yes' if s.met else 'no'} |")
    lines += [
        "",
        "| workload | msg/s | median ms | p99 ms | calls | speed vs raw asyncpg | latency vs @1k "
        "| note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report.rows:
        lat = r.latency
        lines.append(
            f"| {r.workload} | {_num(r.msg_s, 0)} | {_num(lat.median_ms if lat else None, 3)} "
            f"| {_num(lat.p99_ms if lat else None, 3)} | {lat.n if lat else ''} "
            f"| {_num(r.vs_raw)} | {_num(r.vs_1k)} | {r.note} |"
        )
    return "\n".join(lines)


def document(report: Report, meta: dict[str, str]) -> str:
    return "\n".join(
        [
            "# Benchmark results",
            "",
            "Measured by `bench/` in one run on one PostgreSQL server; figures are from a shared,",
            "noisy machine, so read the ratios rather than the absolute times.",
            "",
            *run_facts(meta),
            "",
            table(report),
            "",
            "Notes: raw asyncpg and episodic run alternately in 10 blocks (sequential) or 4",
            "rounds (concurrent), and their times are summed. Messages are ~400 characters;",
            "histories have a tool call/result pair every fifth turn and are grown with batch",
            "appends of 1,000 messages, one conversation per history length; the measurements",
            "at the different lengths then rotate in 10 rounds. Append latency is measured with",
            "single-message appends starting at the stated length. Loads behind a boundary",
            "return the handoff summary, 2 retained user messages and a fixed 200-message tail.",
            "The raw asyncpg load rows fetch as many rows from the minimal table and decode their",
            "JSON with orjson, in the same rotations as episodic's loads. *speed vs raw",
            "asyncpg* is episodic's throughput (or 1 / median latency for loads) over raw",
            "asyncpg's: above 1 is faster. *latency vs @1k* is the median latency over the",
            "median at 1k events: above 1 is slower.",
            "",
        ]
    )


def section_of(text: str, heading: str) -> str:
    """The ``## heading`` section of a markdown ``text`` (to the next ``## `` heading or the
    end), or ``""``."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == f"## {heading}"), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "".join(lines[start:end])


def sections(text: str) -> str:
    """Everything from the first ``## `` heading of ``text`` on (``""`` when it has none)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    return "".join(lines[start:])


def with_section(text: str, heading: str, section: str) -> str:
    """``text`` with its ``## heading`` section replaced in place by ``section`` (appended
    when it has none; removed when ``section`` is empty)."""
    old = section_of(text, heading)
    section = section.rstrip("\n")
    if old:
        rest = old[len(old.rstrip("\n")) :]  # the blank lines before the next heading
        new = section + (rest or "\n") if section else ""
        return text.replace(old, new, 1).rstrip("\n") + "\n"
    text = text.rstrip("\n")
    if section:
        text = (text + "\n\n" if text else "") + section
    return text + "\n"
