"""``python -m bench.handoff``: what survives a compaction, measured with a real model.

Generated agent sessions with planted probes are compacted again and again by each
compactor (episodic's worker and in-run compactor, LangChain's SummarizationMiddleware,
Google ADK's LlmEventSummarizer, truncation and observation masking); at depths 1, 2, 4
and 8 the context is scored and the same model answers the probes from it. The report goes
to ``bench/HANDOFF.md`` (``--output``), a plot and the raw measurements beside it.

Without ``--endpoint`` it runs the local model that ``python -m bench.handoff.model`` set up
(starting its server if it is not running); nothing is downloaded here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.handoff import model as local_model
from bench.handoff.compactors import CHECKS, COMPACTORS, load
from bench.handoff.compactors.base import (
    DEFAULT_HANDOFF_TOKENS,
    DEFAULT_KEEP_TOKENS,
    Budget,
    Compactor,
    Endpoint,
    package_version,
)
from bench.handoff.report import markdown, plot
from bench.handoff.run import RunResult, run
from bench.handoff.sessions import SESSION_KINDS
from bench.provenance import command_line, episodic_source

REPORT = Path(__file__).resolve().parent.parent / "HANDOFF.md"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.handoff", description=__doc__)
    p.add_argument("--endpoint", help="an OpenAI-compatible base URL (default: the local model)")
    p.add_argument("--model", default=local_model.ALIAS, help="model name (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "no-key"))
    p.add_argument("--port", type=int, default=local_model.DEFAULT_PORT, help="local server port")
    p.add_argument(
        "--quick",
        action="store_true",
        help="coding sessions only, depths 1-4, 2 replicates, answers at depth 4",
    )
    p.add_argument("--kinds", nargs="+", choices=SESSION_KINDS, help="session kinds (default: all)")
    p.add_argument(
        "--replicates",
        type=int,
        help="sessions per kind (default: 2; with both kinds, 4 replicates at each depth)",
    )
    p.add_argument("--depths", type=int, nargs="+", help="measured depths (default: 1 2 4 8)")
    p.add_argument(
        "--answer-depths",
        type=int,
        nargs="+",
        help="the depths at which the model answers the probes (default: every measured "
        "depth; --quick: the deepest)",
    )
    p.add_argument(
        "--compactors",
        nargs="+",
        choices=[*COMPACTORS, *CHECKS],
        help="(default: all but the checks)",
    )
    p.add_argument("--handoff-tokens", type=int, default=DEFAULT_HANDOFF_TOKENS)
    p.add_argument("--keep-tokens", type=int, default=DEFAULT_KEEP_TOKENS)
    p.add_argument("--seed", type=int, default=1, help="the first replicate's seed")
    p.add_argument("--output", type=Path, default=REPORT, help="the report (default: %(default)s)")
    p.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: rewrite the report and plot from the JSON beside --output",
    )
    args = p.parse_args(argv)
    args.argv = argv
    args.kinds = args.kinds or (["coding"] if args.quick else list(SESSION_KINDS))
    args.replicates = args.replicates or 2
    args.depths = sorted(set(args.depths or ([1, 2, 4] if args.quick else [1, 2, 4, 8])))
    if args.answer_depths is None and args.quick:
        args.answer_depths = [max(args.depths)]
    args.compactors = args.compactors or list(COMPACTORS)
    if args.replicates < 1 or min(args.depths) < 1:
        p.error("--replicates and --depths must be at least 1")
    return args


def facts(
    args: argparse.Namespace, endpoint: Endpoint, result: RunResult, source: str
) -> list[str]:
    label = local_model.MODEL_LABEL if args.endpoint is None else f"`{endpoint.model}`"
    return [
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; run took {result.seconds / 60:.0f} min",
        f"- machine: {os.cpu_count()} CPUs, {platform.machine()}, "
        f"Python {platform.python_version()}",
        f"- model: {label} at {endpoint.base_url}, temperature 0",
        f"- budget: handoff at most {args.handoff_tokens} tokens; about {args.keep_tokens} tokens "
        "of the newest messages kept word for word (each compactor in its own unit)",
        f"- sessions: {', '.join(args.kinds)}; {args.replicates} replicates each (seeds "
        f"{args.seed}..{args.seed + args.replicates - 1}); "
        f"depths {', '.join(map(str, args.depths))}"
        + (
            f"; the model answers the probes at depth {', '.join(map(str, args.answer_depths))}"
            " only"
            if args.answer_depths
            else ""
        ),
        f"- episodic: {source}",
        f"- peers: langchain {package_version('langchain')}, langchain-openai "
        f"{package_version('langchain-openai')}, google-adk {package_version('google-adk')}",
        f"- command: `{command_line('bench.handoff', args.argv)}`",
    ]


def render_only(output: Path) -> int:
    """The report and plot again from a run's JSON (its facts, compactors and depths)."""
    data = json.loads(output.with_suffix(".json").read_text())
    result = RunResult.from_json(data)
    picture = output.with_suffix(".png")
    names = [name for name, _ in data["compactors"] if name not in result.skipped]
    drew = plot(result, names, data["depths"], picture)
    output.write_text(
        markdown(
            result,
            compactors=[tuple(c) for c in data["compactors"]],
            depths=data["depths"],
            facts=data["facts"],
            plot_name=picture.name if drew else None,
            summarizers=data.get("summarizers", ()),
        )
    )
    print(f"wrote {output}" + (f" and {picture}" if drew else " (no matplotlib: no plot)"))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render_only:
        return render_only(args.output)
    if args.endpoint is None:
        try:
            base_url = local_model.serve(args.port)
        except local_model.ModelMissing as missing:
            print(f"bench.handoff: {missing}", file=sys.stderr)
            return 1
    else:
        base_url = args.endpoint.rstrip("/")
    endpoint = Endpoint(base_url, args.model, args.api_key)
    # read once, before the run: the checkout may change while a long run goes on
    source = episodic_source()
    budget = Budget(handoff_tokens=args.handoff_tokens, keep_tokens=args.keep_tokens)
    classes: list[type[Compactor]] = []
    skipped: dict[str, str] = {}
    for name in args.compactors:
        found = load(name)
        if isinstance(found, str):
            skipped[name] = found
        else:
            classes.append(found)
    summarizers = [cls.name for cls in classes if cls.needs_model]
    output: Path = args.output
    raw = output.with_suffix(".json")
    picture = output.with_suffix(".png")

    def write(result: RunResult) -> None:
        result.skipped.update(skipped)
        described = [(name, _describe(name, classes, skipped)) for name in args.compactors]
        drew = plot(result, [c.name for c in classes], args.depths, picture)
        said = facts(args, endpoint, result, source)
        output.write_text(
            markdown(
                result,
                compactors=described,
                depths=args.depths,
                facts=said,
                plot_name=picture.name if drew else None,
                summarizers=summarizers,
            )
        )
        run = {
            "facts": said,
            "compactors": described,
            "depths": args.depths,
            "summarizers": summarizers,
        }
        raw.write_text(json.dumps({**run, **result.to_json()}, indent=1))

    result = asyncio.run(
        run(
            classes,
            endpoint=endpoint,
            budget=budget,
            kinds=args.kinds,
            replicates=args.replicates,
            depths=args.depths,
            seed=args.seed,
            answer_depths=args.answer_depths,
            on_measure=write,
        )
    )
    write(result)
    print(
        f"wrote {output} ({len(result.measurements)} measurements, {result.seconds / 60:.1f} min)"
    )
    return 0


def _describe(name: str, classes: list[type[Compactor]], skipped: dict[str, str]) -> str:
    for cls in classes:
        if cls.name == name:
            return cls.describes
    return skipped.get(name, "")


if __name__ == "__main__":
    sys.exit(main())
