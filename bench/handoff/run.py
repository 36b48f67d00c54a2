"""One benchmark run: every session, replicate and compactor, compacted again and again.

A chain is one session under one compactor: phases 0 and 1 are added, then it is compacted;
each later phase is added and compacted again, so compaction ``d`` is the d-th in a row and
early facts reach it only through the handoffs before it. At each measured depth the
context the next model call would see is scored (see ``scoring``), and the model answers
every probe's question in one call, given that context alone.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.handoff.compactors.base import Budget, Compactor, Endpoint, count_tokens
from bench.handoff.scoring import ProbeScore, parse_answers, questions_prompt, render, score
from bench.handoff.sessions import Session, generate

#: the most tokens the model may answer the probes with (eight short answers)
ANSWER_TOKENS = 200
#: the hits a probe's question is searched for (search recall@5)
SEARCH_HITS = 5


@dataclass(frozen=True, slots=True)
class Measurement:
    """One chain at one depth."""

    session: str
    seed: int
    compactor: str
    depth: int
    context_tokens: int
    compact_seconds: float
    scores: tuple[ProbeScore, ...]
    #: the first message of the context (the handoff, where there is one), for quoting
    head: str
    answers: tuple[str, ...]
    #: the whole context as the model was given it, and its reply to the questions
    context: str = ""
    reply: str = ""
    #: whether the model was asked the probes at this depth (``--quick`` asks at the
    #: deepest only); when not, the answer scores are not measurements
    asked: bool = True
    #: the model's reply given the context and each question's search hits
    search_reply: str = ""


@dataclass(slots=True)
class RunResult:
    measurements: list[Measurement] = field(default_factory=list)
    #: compactor -> why it did not run
    skipped: dict[str, str] = field(default_factory=dict)
    #: (compactor, session, seed) -> the error that ended the chain
    failures: list[tuple[str, str, int, str]] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "measurements": [asdict(m) for m in self.measurements],
            "skipped": self.skipped,
            "failures": self.failures,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        measurements = [
            Measurement(**{**m, "scores": tuple(ProbeScore(**s) for s in m["scores"]),
                           "answers": tuple(m["answers"])})
            for m in data["measurements"]
        ]  # fmt: skip
        failures = [tuple(f) for f in data["failures"]]
        return cls(measurements, dict(data["skipped"]), failures, float(data["seconds"]))  # type: ignore[arg-type]


class Answerer:
    """The same model, asked the probes' questions about a context (temperature 0)."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        self.model = endpoint.model
        self.client = endpoint.client(timeout)

    async def answer(
        self, context: str, session: Session, found: Sequence[Sequence[str]] | None = None
    ) -> str:
        prompt = questions_prompt(context, session.probes, found)
        response = await self.client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=ANSWER_TOKENS,
            temperature=0.0,
        )
        return response.choices[0].message.content or ""

    async def close(self) -> None:
        await self.client.close()


def _say(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:6.0f} s] {text}", file=sys.stderr, flush=True)


async def run_chain(
    compactor: Compactor,
    session: Session,
    depths: Sequence[int],
    answerer: Answerer,
    started: float,
    ask: Collection[int] | None = None,
) -> list[Measurement]:
    """One session under one compactor, measured at ``depths``; the model answers the
    probes at the depths in ``ask`` (all measured depths when None)."""
    found = []
    await compactor.open()
    try:
        await compactor.add(session.phases[0])
        for depth in range(1, max(depths) + 1):
            await compactor.add(session.phases[depth])
            began = time.monotonic()
            await compactor.compact()
            took = time.monotonic() - began
            if depth not in depths:
                chain = f"{session.kind} seed {session.seed} {compactor.name}"
                _say(started, f"{chain} depth {depth}: compacted in {took:.0f} s")
                continue
            messages = await compactor.context()
            context = render(messages)
            asked = ask is None or depth in ask
            reply = await answerer.answer(context, session) if asked else ""
            answers = parse_answers(reply, len(session.probes))
            hits = await _search(compactor, session)
            search_reply = ""
            with_search = None
            if hits is not None and asked:
                search_reply = await answerer.answer(context, session, hits)
                with_search = parse_answers(search_reply, len(session.probes))
            scores = score(session.probes, context, answers, hits, with_search)
            found.append(
                Measurement(
                    session=session.kind,
                    seed=session.seed,
                    compactor=compactor.name,
                    depth=depth,
                    context_tokens=count_tokens(messages),
                    compact_seconds=took,
                    scores=tuple(scores),
                    head=messages[0].text if messages else "",
                    answers=tuple(answers),
                    context=context,
                    reply=reply,
                    asked=asked,
                    search_reply=search_reply,
                )
            )
            held = sum(s.in_context for s in scores)
            said = f", answered {sum(s.answered for s in scores)}/{len(scores)}" if asked else ""
            if hits is not None:
                said += f", search@{SEARCH_HITS} {sum(bool(s.searched) for s in scores)}"
            if with_search is not None:
                helped = sum(bool(s.answered_with_search) for s in scores)
                said += f", answered with search {helped}"
            _say(
                started,
                f"{session.kind} seed {session.seed} {compactor.name} depth {depth}: compacted "
                f"in {took:.0f} s, context {found[-1].context_tokens} tokens, in context "
                f"{held}/{len(scores)}{said}",
            )
    finally:
        await compactor.close()
    return found


async def _search(compactor: Compactor, session: Session) -> list[list[str]] | None:
    """Each probe's question searched in the compactor's log; None when it keeps none."""
    found = []
    for probe in session.probes:
        hits = await compactor.search(probe.question, SEARCH_HITS)
        if hits is None:
            return None
        found.append(hits)
    return found


async def run(
    compactors: Sequence[type[Compactor]],
    *,
    endpoint: Endpoint,
    budget: Budget,
    kinds: Sequence[str],
    replicates: int,
    depths: Sequence[int],
    seed: int = 1,
    answer_depths: Collection[int] | None = None,
    on_measure: Callable[[RunResult], None] | None = None,
) -> RunResult:
    """Every kind x replicate x compactor chain; a compactor that cannot run is skipped
    (and said so), a chain that fails is recorded and the run goes on."""
    result = RunResult()
    started = time.monotonic()
    runnable = []
    for cls in compactors:
        reason = cls.unavailable()
        if reason is None:
            runnable.append(cls)
        else:
            result.skipped[cls.name] = reason
            _say(started, f"{cls.name}: skipped ({reason})")
    answerer = Answerer(endpoint, budget.timeout)
    try:
        for kind in kinds:
            for replicate in range(replicates):
                session = generate(kind, seed + replicate, max(depths) + 1)
                for cls in runnable:
                    compactor = cls(endpoint if cls.needs_model else None, budget)
                    try:
                        result.measurements += await run_chain(
                            compactor, session, depths, answerer, started, answer_depths
                        )
                    except Exception as exc:  # a failed chain is a finding, not the end
                        failure = f"{type(exc).__name__}: {exc}"[:500]
                        result.failures.append((cls.name, kind, session.seed, failure))
                        _say(started, f"{kind} seed {session.seed} {cls.name}: FAILED {failure}")
                    if on_measure is not None:
                        on_measure(result)
    finally:
        await answerer.close()
    result.seconds = time.monotonic() - started
    return result
