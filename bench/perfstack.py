"""``perf script -F ip,sym | python -m bench.perfstack``: inclusive shares of a backend's time.

For the server side of ``bench/PROFILE.md``: record a PostgreSQL backend while it serves
appends (``perf record -F 999 --call-graph dwarf -p PID -- sleep 5``; Debian's ``linux-perf``,
no debug symbols needed for the exported functions), then pipe ``perf script -F ip,sym`` in.
Prints, for the executor's and the protocol's main entry points, the share of samples whose
stack holds them, and who calls ``ExecInitFunctionScan`` (the table functions' set-up).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable

#: What the server spends an append on, coarsest first.
FRAMES = (
    "plpgsql_exec_function",
    "SPI_execute_plan_with_paramlist",
    "standard_ExecutorStart",
    "ExecInitModifyTable",
    "ExecInitIndexScan",
    "ExecInitLockRows",
    "ExecInitFunctionScan",
    "ExecConstraints",
    "stringToNode",
    "jsonb_in",
    "ExecInsertIndexTuples",
    "heap_update",
    "heap_insert",
    "XLogInsert",
    "standard_ExecutorEnd",
    "CommitTransactionCommand",
    "PortalStart",
    "pq_getbyte",
    "secure_write",
    "__GI_kill",
)


def samples(lines: Iterable[str]) -> list[list[str]]:
    """The stacks, innermost frame first, each frame its symbol."""
    stacks: list[list[str]] = []
    current: list[str] = []
    for line in lines:
        fields = line.strip().split(None, 1)
        if not fields:
            if current:
                stacks.append(current)
            current = []
            continue
        symbol = fields[1].split("+")[0].removesuffix(" (inlined)") if len(fields) > 1 else "?"
        current.append(symbol)
    if current:
        stacks.append(current)
    return stacks


def report(stacks: list[list[str]]) -> str:
    n = len(stacks) or 1
    inclusive = Counter(frame for stack in stacks for frame in set(stack) if frame in FRAMES)
    callers: Counter[str] = Counter()
    for stack in stacks:
        if "ExecInitFunctionScan" in stack:
            start = stack.index("ExecInitFunctionScan") + 1
            above = [f for f in stack[start:] if f != "[unknown]"]
            callers[" < ".join(above[:3])] += 1
    rows = [f"| `{frame}` | {100 * inclusive[frame] / n:.1f}% |" for frame in FRAMES]
    calls = [f"| {chain} | {100 * count / n:.1f}% |" for chain, count in callers.most_common(4)]
    return (
        f"{len(stacks):,} samples\n\n| frame on the stack | share |\n|---|---:|\n"
        + "\n".join(rows)
        + "\n\n| ExecInitFunctionScan called from | share |\n|---|---:|\n"
        + "\n".join(calls)
    )


if __name__ == "__main__":
    print(report(samples(sys.stdin)))
