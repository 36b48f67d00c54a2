"""T19 soak: a real ``episodic serve`` and ``episodic worker`` under steady mixed load for a
bounded time, every process's footprint sampled: nothing accumulates, nothing is lost, every
refusal is typed.

Scenario. One tenant, two API keys (a plain and an operator key). ``episodic serve`` and
``episodic worker`` run as processes of their own on a fresh database; the worker's summarizer
is an OpenAI-compatible fake (tests/support_openai.py) in the test process that answers every
call after 0.3 s with a fixed handoff, and a low context trigger keeps compactions steady.
Six writers keep 16 live conversations busy over HTTP, pausing 0 to 80 ms between requests:
appends of a user and an assistant message (every message with a client id, every batch with
an ``Idempotency-Key``, retried with it on a typed 503 or a network error), loads of the
context (episodic, openai and anthropic formats, half of them with ``If-None-Match``), heads
and pages of events. An eraser erases one conversation every 2 s with the operator key and
creates its replacement: three erasures in four are *audited* (the conversation is taken out of
the writers' hands, its in-flight requests awaited, then its whole log read over HTTP and
checked against every append acknowledged to it, then erased); the fourth *races* the writers
(it takes a conversation with requests in flight: they may get 404, and what had been
acknowledged to it is excused). At the end
every surviving conversation is audited the same way, and both processes are stopped with
SIGTERM. Every 2 s, for the server and the worker: RSS (VmRSS), open file descriptors
(/proc/PID/fd), and PostgreSQL connections (its sockets to the database's port, from the
kernel's TCP table); and the database's backends for the test database (pg_stat_activity).

Pass criteria.
- **0 lost, 0 duplicated:** every acknowledged append of every audited conversation is in its
  log exactly once, at the seq it was acknowledged with; seqs are 1..n with no gap; no client
  id twice; the erased conversations have 0 events left and one tombstone each.
- **0 untyped errors:** every answer that is not 2xx/304 is ``application/problem+json`` with
  a type naming an ``episodic.errors`` class and that class's status; the only ones expected
  are 404 ``NotFoundError`` for a conversation whose erasure had begun, and a 503
  (``OverloadedError``, ``TransientDatabaseError``) that is counted and retried. No 500 in the
  server's own metrics, no ERROR line or traceback in either process's log, compaction outcomes
  only ``succeeded``, ``nothing_to_compact``, ``conflict`` and ``gone``, both processes exit 0
  on SIGTERM.
- **Flat after warm-up:** the first third of the samples is the warm-up (pools filling,
  statement caches, the allocator's arenas); the largest value of the last third is compared
  with the largest of the middle third, the same length of time under the same load. Max
  against max, because every steady-state value (a request or a summarizer call in flight at
  the sampled instant) recurs many times in a third, so only accumulation lifts the last
  third's peak above the middle's.
  - descriptors other than database connections may grow by at most 2 (the server's open
    client connections vary with the requests in flight, the worker's with its summarizer
    calls): one descriptor leaked per erasure adds 20 in a CI-size third, per compaction
    hundreds;
  - PostgreSQL connections grow only within the pools: the server's never above its store's
    pool, its key lookups' pool and its key store's engine (6 + 4 + 3), the worker's never
    above its pool and its LISTEN connection (4 + 1), the database's backends never above
    their sum and the sampler's one (a pool reaches a new peak whenever the load happens to
    peak, so growth inside it is no leak; a connection held outside it is);
  - RSS may grow by at most 6 MiB. Healthy runs: at CI size the server, still settling,
    grows by 1.4 to 2.2 MiB between the thirds and the worker by under 1 MiB; over 10
    minutes the server settles after about 5 (3.5 MiB in all after the first 40 s, so even
    all of it in one third passes) and the worker grows by 0.4 MiB between its 200-second
    thirds; tracemalloc sees no Python object accumulating in either: the allocator
    settling. At CI size 6 MiB is about 1 KiB kept per request or 17 KiB per compaction;
    nightly, with thirds 30 times longer, 30 times less;
  - pace: the last third's acknowledged appends and compactions are at least a quarter of
    the middle third's (a process slowing down as it runs, a pool drained by leaked
    connections, is as much a leak as one growing; a quarter, for a shared machine).

Sizes: 2 minutes of load at CI size (about 2.5 minutes in all), an hour nightly
(``EPISODIC_TEST_NIGHTLY=1``); ``EPISODIC_TEST_T19_SECONDS`` sets another length.

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
     .venv/bin/pytest tests/reliability/test_t19_soak.py -q -s
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.engine import make_url

from episodic import errors
from episodic.server.keys import KeyStore
from episodic.server.problems import PROBLEM_MEDIA_TYPE, STATUS_OF, TYPE_PREFIX
from tests.integration.worker_processes import STARTED, EpisodicProcess, wait_until
from tests.reliability.sizes import seeded, size
from tests.reliability.soak_support import (
    Footprint,
    Growth,
    Pace,
    ScriptedSummarizer,
    footprint,
    growth,
    log_problems,
    metric_values,
    mib,
    pace,
    start_child,
    wait_healthy,
)
from tests.server.live import free_port
from tests.support import asyncpg_dsn
from tests.support_openai import Reply, chat_completion

pytestmark = pytest.mark.postgres_only

#: seconds of load: read at import (the conftest scrubs EPISODIC_* from each test)
DURATION = float(os.environ.get("EPISODIC_TEST_T19_SECONDS") or size(120, 3_600))
SEED = 19
SAMPLE_SECONDS = 2.0
WRITERS = 6
LIVE_CONVERSATIONS = 16
#: a writer's pause between two requests, seconds
THINK = (0.0, 0.08)
ERASE_EVERY = 2.0
#: every fourth erasure races the writers; the others are audited first
RACING_EVERY = 4
SUMMARIZER_DELAY = 0.3
HANDOFF = (
    "Handoff: the user is drafting the quarterly report with the assistant; the figures for "
    "April to June are agreed, the chart legends still need their units, and the summary "
    "paragraph is to stay under 120 words. Next: check the totals against the ledger."
)
#: the context tokens that make a conversation due: a few appends' worth
TRIGGER_TOKENS = 1_500
SERVER_POOL = 6
WORKER_POOL = 4
WORKER_CONCURRENCY = 4
#: the server's PostgreSQL connections at most: its store's pool, the key lookups' pool (4)
#: and the key store's SQLAlchemy engine (1 + 2 overflow)
SERVER_CONNECTIONS = SERVER_POOL + 4 + 3
#: the worker's: its store's pool and its LISTEN connection
WORKER_CONNECTIONS = WORKER_POOL + 1
#: descriptors other than database connections may grow this much (see the docstring)
FD_SLACK = 2
#: RSS may grow this much, MiB (see the docstring)
RSS_SLACK_MIB = 6.0
#: the last third's appends and compactions: at least this part of the middle third's
PACE_KEPT = 0.25
#: tries of one request answered 503 or lost on the network, and the seconds of each
TRIES = 20
REQUEST_TIMEOUT = 20.0
#: how long the load's requests in flight may take to end once the load stops, seconds
STOP_GRACE = 60.0
#: the compaction outcomes this load may produce
EXPECTED = {"succeeded", "nothing_to_compact", "conflict", "gone"}
RETRIED_KINDS = {"OverloadedError", "TransientDatabaseError"}
TENANT = "soak"
WORDS = (
    "report figures quarter ledger chart legend units totals revenue margin draft review table "
    "column summary paragraph april may june forecast budget variance check agreed pending "
    "source invoice region north south east west growth decline steady"
)


@dataclass
class Conversation:
    cid: str
    #: client id -> the seq its append was acknowledged with
    acked: dict[str, int] = field(default_factory=dict)
    #: requests of the writers on it right now
    in_flight: int = 0
    #: live, auditing, erasing or erased
    state: str = "live"
    etag: str | None = None


@dataclass
class Tally:
    appends: int = 0
    messages: int = 0
    loads: int = 0
    not_modified: int = 0
    reads: int = 0
    created: int = 0
    erasures: int = 0
    racing: int = 0
    audits: int = 0
    audited_messages: int = 0
    boundaries_seen: int = 0
    retried_503: int = 0
    transport_errors: int = 0
    excused_404: int = 0
    #: appends never acknowledged because their conversation was erased under them
    excused_unacked: int = 0
    #: answers that are no episodic problem (a 500, a body that is no problem+json)
    untyped: list[str] = field(default_factory=list)
    #: typed answers nothing here should get
    unexpected: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)


@dataclass
class Sample:
    at: float
    server: Footprint
    worker: Footprint
    backends: int
    #: running counts: appends acknowledged, summarizer calls (compactions)
    appends: int
    compactions: int


class Soak:
    """The load and the audits of one run."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        key: str,
        operator_key: str,
        rng: random.Random,
    ) -> None:
        self.http = http
        self.as_writer = {"Authorization": f"Bearer {key}"}
        self.as_operator = {"Authorization": f"Bearer {operator_key}"}
        self.rng = rng
        self.tally = Tally()
        #: the conversations the writers may pick
        self.live: list[Conversation] = []
        #: the ids of the erased ones
        self.erased: list[str] = []
        self.stop = asyncio.Event()

    # ---- one request, judged ----------------------------------------------------------------

    async def call(
        self,
        method: str,
        url: str,
        conversation: Conversation | None,
        *,
        operator: bool = False,
        headers: dict[str, str] | None = None,
        json: Any = None,
        params: dict[str, Any] | None = None,
    ) -> httpx.Response | None:
        """The answer when it is 2xx or 304; None when it is a 404 excused by the
        conversation's erasure, or a problem (recorded). A typed 503 and a network error are
        retried, the same request again (an append keeps its Idempotency-Key)."""
        sent = {**(self.as_operator if operator else self.as_writer), **(headers or {})}
        for _ in range(TRIES):
            try:
                response = await self.http.request(
                    method, url, headers=sent, json=json, params=params
                )
            except httpx.TransportError as exc:
                self.tally.transport_errors += 1
                if self.tally.transport_errors <= 5:
                    print(f"\nT19: {method} {url}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(0.2)
                continue
            status = response.status_code
            if status < 300 or status == 304:
                return response
            kind = _problem_kind(response)
            said = f"{method} {url} -> {status} {response.text[:300]!r}"
            # untyped: no problem naming an episodic error class, a status other than its
            # class's, a server error other than the retried ones (a 500 is never typed)
            if (
                kind is None
                or _status_of_kind(kind) != status
                or (status >= 500 and kind not in RETRIED_KINDS)
            ):
                self.tally.untyped.append(said)
                return None
            if status == 503:
                self.tally.retried_503 += 1
                await asyncio.sleep(min(float(response.headers.get("retry-after", "1")), 1.0))
                continue
            if (
                status == 404
                and kind == "NotFoundError"
                and conversation is not None
                and conversation.state in ("erasing", "erased")
            ):
                self.tally.excused_404 += 1
                return None
            self.tally.unexpected.append(said)
            return None
        self.tally.unexpected.append(f"{method} {url}: no answer after {TRIES} tries")
        return None

    # ---- the writers ------------------------------------------------------------------------

    async def writer(self, number: int) -> None:
        rng = random.Random(self.rng.random())
        sequence = 0
        while not self.stop.is_set():
            conversation = rng.choice(self.live)
            roll = rng.random()
            conversation.in_flight += 1
            try:
                if roll < 0.55:
                    sequence += 1
                    await self.append(conversation, f"w{number}-{sequence}", rng)
                elif roll < 0.90:
                    await self.load(conversation, rng)
                elif roll < 0.95:
                    url = f"/v1/conversations/{conversation.cid}"
                    if await self.call("GET", url, conversation) is not None:
                        self.tally.reads += 1
                else:
                    url = f"/v1/conversations/{conversation.cid}/events"
                    params = {"after_seq": rng.randint(0, 20), "limit": 50}
                    if await self.call("GET", url, conversation, params=params) is not None:
                        self.tally.reads += 1
            finally:
                conversation.in_flight -= 1
            await asyncio.sleep(rng.uniform(*THINK))

    async def append(self, conversation: Conversation, key: str, rng: random.Random) -> None:
        ids = (f"{key}-u", f"{key}-a")
        body = {
            "messages": [
                {"role": "user", "content": _text(rng, key, 40), "client_id": ids[0]},
                {"role": "assistant", "content": _text(rng, key, 70), "client_id": ids[1]},
            ]
        }
        url = f"/v1/conversations/{conversation.cid}/messages"
        answer = await self.call(
            "POST", url, conversation, headers={"Idempotency-Key": key}, json=body
        )
        if answer is None:
            if conversation.state in ("erasing", "erased"):
                self.tally.excused_unacked += 1
            return
        events = answer.json()["events"]
        stored = tuple(event["message"]["client_id"] for event in events)
        if stored != ids:
            self.tally.unexpected.append(f"append {key}: acknowledged {stored}, sent {ids}")
        for event in events:
            conversation.acked[event["message"]["client_id"]] = event["seq"]
        self.tally.appends += 1
        self.tally.messages += len(events)

    async def load(self, conversation: Conversation, rng: random.Random) -> None:
        form = rng.choice(("episodic", "episodic", "openai", "anthropic"))
        headers = {}
        if conversation.etag is not None and rng.random() < 0.5:
            headers["If-None-Match"] = conversation.etag
        url = f"/v1/conversations/{conversation.cid}/context"
        answer = await self.call("GET", url, conversation, headers=headers, params={"format": form})
        if answer is None:
            return
        self.tally.loads += 1
        if answer.status_code == 304:
            self.tally.not_modified += 1
        else:
            conversation.etag = answer.headers["etag"]

    # ---- the eraser -------------------------------------------------------------------------

    async def create(self) -> None:
        answer = await self.call("POST", "/v1/conversations", None, json={})
        assert answer is not None, self.tally.untyped[-1:] + self.tally.unexpected[-1:]
        self.live.append(Conversation(answer.json()["conversation"]["conversation_id"]))
        self.tally.created += 1

    async def eraser(self) -> None:
        next_at = time.monotonic() + ERASE_EVERY
        while not self.stop.is_set():
            with_time = next_at - time.monotonic()
            if with_time > 0:
                try:
                    await asyncio.wait_for(self.stop.wait(), with_time)
                    return
                except TimeoutError:
                    pass
            next_at += ERASE_EVERY
            racing = self.tally.erasures % RACING_EVERY == RACING_EVERY - 1
            # a racing erasure takes a conversation with requests in flight when there is one
            busy = [c for c in self.live if c.in_flight] if racing else []
            conversation = self.rng.choice(busy or self.live)
            self.live.remove(conversation)  # no writer starts a request on it any more
            if racing:
                conversation.state = "erasing"
                self.tally.racing += 1
            else:
                conversation.state = "auditing"
                await wait_until(
                    _quiet(conversation),
                    within=60,
                    what=f"the requests on {conversation.cid} to end",
                    interval=0.01,
                )
                await self.audit(conversation)
                conversation.state = "erasing"
            url = f"/v1/conversations/{conversation.cid}/erase"
            erased = await self.call("POST", url, None, operator=True, json={"reason": "T19 soak"})
            conversation.state = "erased"
            conversation.acked.clear()  # excused now; an hour's soak erases thousands
            self.erased.append(conversation.cid)
            if erased is not None:
                self.tally.erasures += 1
            await self.create()

    # ---- the audit --------------------------------------------------------------------------

    async def audit(self, conversation: Conversation) -> None:
        """Read the whole log over HTTP; check it against what was acknowledged."""
        events: list[dict[str, Any]] = []
        after = 0
        while True:
            url = f"/v1/conversations/{conversation.cid}/events"
            page = await self.call(
                "GET", url, conversation, params={"after_seq": after, "limit": 1000}
            )
            assert page is not None, f"audit of {conversation.cid}: {self.tally.unexpected[-1:]}"
            found = page.json()
            events.extend(found["events"])
            if found["next_after_seq"] is None:
                break
            after = found["next_after_seq"]
        seqs = [event["seq"] for event in events]
        if seqs != list(range(1, len(seqs) + 1)):
            self.tally.lost.append(f"{conversation.cid}: seqs are not 1..n: {seqs[:50]}")
        at: dict[str, int] = {}
        counts: Counter[str] = Counter()
        for event in events:
            if event["kind"] == "boundary":
                self.tally.boundaries_seen += 1
            elif event["kind"] == "message":
                client_id = event["message"].get("client_id")
                if client_id is not None:
                    counts[client_id] += 1
                    at[client_id] = event["seq"]
        for client_id, seq in conversation.acked.items():
            if at.get(client_id) != seq:
                self.tally.lost.append(
                    f"{conversation.cid}: {client_id} acknowledged at seq {seq}, "
                    f"found at {at.get(client_id)}"
                )
        self.tally.duplicated.extend(
            f"{conversation.cid}: {client_id} x{n}" for client_id, n in counts.items() if n > 1
        )
        self.tally.audits += 1
        self.tally.audited_messages += len(conversation.acked)


# ---- the run ----------------------------------------------------------------------------------


@pytest.fixture
def children() -> Iterator[list[EpisodicProcess]]:
    """The processes started; killed afterwards whatever happened (before the database is
    dropped)."""
    started: list[EpisodicProcess] = []
    try:
        yield started
    finally:
        for child in started:
            child.kill()


async def test_t19_soak_is_flat_and_loses_nothing(
    postgres_url: str, tmp_path: Path, children: list[EpisodicProcess]
) -> None:
    began = time.monotonic()
    keys = KeyStore.open(postgres_url)
    try:
        _, key = await keys.create(TENANT, label="T19 writer")
        _, operator_key = await keys.create(TENANT, operator=True, label="T19 eraser")
    finally:
        await keys.close()
    port, metrics_port = free_port(), free_port()
    base_url = f"http://127.0.0.1:{port}"
    compaction = {
        "trigger_context_tokens": TRIGGER_TOKENS,
        "recent_user_token_budget": 150,
        "shutdown_grace_seconds": 10,
    }
    problems: list[str] = []
    summarizer = ScriptedSummarizer(
        Reply(200, chat_completion(HANDOFF, prompt_tokens=900), delay=SUMMARIZER_DELAY)
    )
    async with summarizer:
        server = start_child(
            "server",
            ["serve", "--port", str(port)],
            database_url=postgres_url,
            settings={**compaction, "pool_max_size": SERVER_POOL},
            directory=tmp_path,
        )
        children.append(server)
        worker = start_child(
            "worker",
            ["worker"],
            database_url=postgres_url,
            settings={
                **compaction,
                "pool_max_size": WORKER_POOL,
                "worker_concurrency": WORKER_CONCURRENCY,
                "summarizer": "openai",
                "summarizer_base_url": summarizer.base_url,
                "summarizer_model": "fake-model",
                "summarizer_api_key": "k",
                "summarizer_timeout": 30,
                "metrics_port": metrics_port,
            },
            directory=tmp_path,
        )
        children.append(worker)
        await asyncio.to_thread(wait_healthy, server, base_url)
        await wait_until(
            lambda: STARTED.search(worker.log()) is not None or not worker.alive(),
            within=30,
            what="the worker to start",
            describe=worker.log_tail,
        )
        assert worker.alive(), worker.log_tail()

        limits = httpx.Limits(max_connections=WRITERS + 2, max_keepalive_connections=WRITERS + 2)
        async with httpx.AsyncClient(
            base_url=base_url, limits=limits, timeout=REQUEST_TIMEOUT, trust_env=False
        ) as http:
            soak = Soak(http, key, operator_key, seeded(SEED))
            for _ in range(LIVE_CONVERSATIONS):
                await soak.create()
            db = await asyncpg.connect(asyncpg_dsn(postgres_url))
            try:
                probe = Probe(server, worker, db, postgres_url, soak, summarizer)
                samples, stuck = await _load(soak, probe)
                loaded = samples[-1].at + SAMPLE_SECONDS
                if stuck:
                    problems.append(
                        f"{stuck} load tasks had no answer {STOP_GRACE:g} s after the load "
                        "stopped (the final audits are skipped)"
                    )
                else:
                    problems.extend(await _final_audit(soak, db))
            finally:
                await db.close()
            served = await _scrape(http, "/metrics", problems)
            counted = await _scrape(http, f"http://127.0.0.1:{metrics_port}/metrics", problems)
        for child in (server, worker):
            code = await asyncio.to_thread(child.stop, 30)
            if code != 0:
                problems.append(f"the {child.name} exited {code} on SIGTERM")

    tally = soak.tally
    statuses = Counter[str]()
    for labels, count in metric_values(served, "episodic_http_requests_total").items():
        statuses[labels.rsplit('status="', 1)[1].rstrip('"')] += int(count)
    compactions = metric_values(counted, "episodic_compaction_attempts_total")
    outcomes = {labels.split('"')[1]: int(count) for labels, count in compactions.items() if count}
    verdicts = _verdicts(samples)
    _write_samples(samples, tmp_path / "samples.csv")
    summary = _summary(
        tally, samples, verdicts, loaded, outcomes, summarizer.calls, time.monotonic() - began
    )
    print(summary)
    problems[:0] = [
        *(f"untyped: {line}" for line in tally.untyped[:10]),
        *(f"unexpected: {line}" for line in tally.unexpected[:10]),
        *(f"lost: {line}" for line in tally.lost[:10]),
        *(f"duplicated: {line}" for line in tally.duplicated[:10]),
        *(f"server log: {line}" for line in log_problems(server.log())[:10]),
        *(f"worker log: {line}" for line in log_problems(worker.log())[:10]),
        *(f"the server answered {s} x {n}" for s, n in statuses.items() if s.startswith("5")),
        *(f"compaction outcome {o} x {n}" for o, n in outcomes.items() if o not in EXPECTED),
        *(f"not flat: {v.describe()}" for v in verdicts if not v.ok),
    ]
    if not outcomes.get("succeeded") or not tally.erasures or not tally.audits:
        problems.append("the load did not compact, erase and audit")
    assert not problems, "\n".join([summary, *problems, f"samples and logs: {tmp_path}"])


@dataclass
class Probe:
    """What a sample reads: the two processes, the database, the running counts."""

    server: EpisodicProcess
    worker: EpisodicProcess
    db: asyncpg.Connection
    database_url: str
    soak: Soak
    summarizer: ScriptedSummarizer

    async def sample(self, at: float) -> Sample:
        for child in (self.server, self.worker):
            assert child.alive(), child.log_tail()
        database = make_url(self.database_url)
        pg_port = database.port or 5432
        return Sample(
            at=at,
            server=footprint(self.server.pid, pg_port),
            worker=footprint(self.worker.pid, pg_port),
            backends=await self.db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", database.database
            ),
            appends=self.soak.tally.appends,
            compactions=self.summarizer.calls,
        )


async def _load(soak: Soak, probe: Probe) -> tuple[list[Sample], int]:
    """Run the writers and the eraser for DURATION seconds, sampling every SAMPLE_SECONDS;
    the samples, and how many load tasks were still waiting for an answer STOP_GRACE
    seconds after the end (cancelled then)."""
    samples: list[Sample] = []
    tasks = [asyncio.create_task(soak.writer(n)) for n in range(WRITERS)]
    tasks.append(asyncio.create_task(soak.eraser()))
    started = time.monotonic()
    try:
        while (elapsed := time.monotonic() - started) < DURATION:
            samples.append(await probe.sample(elapsed))
            ended = [task for task in tasks if task.done()]
            if ended:
                await ended[0]  # raises what ended it
                raise AssertionError("a load task ended early")
            await asyncio.sleep(SAMPLE_SECONDS - (time.monotonic() - started) % SAMPLE_SECONDS)
    finally:
        soak.stop.set()
        _, stuck = await asyncio.wait(tasks, timeout=STOP_GRACE)
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)
    for task in tasks:
        if not task.cancelled():
            task.result()  # raises what a task raised
    return samples, len(stuck)


async def _scrape(http: httpx.AsyncClient, url: str, problems: list[str]) -> str:
    """A Prometheus exposition ("" and a problem when there is no answer)."""
    try:
        return (await http.get(url)).raise_for_status().text
    except httpx.HTTPError as exc:
        problems.append(f"GET {url}: {type(exc).__name__}: {exc}")
        return ""


async def _final_audit(soak: Soak, db: asyncpg.Connection) -> list[str]:
    """Audit every surviving conversation; the erased ones must have 0 events left and a
    tombstone each."""
    for conversation in soak.live:
        await soak.audit(conversation)
    erased = [uuid.UUID(cid) for cid in soak.erased]
    left = await db.fetchval(
        "SELECT count(*) FROM episodic_events WHERE conversation_id = ANY($1)", erased
    )
    tombstones = await db.fetchval(
        "SELECT count(*) FROM episodic_erasures WHERE conversation_id = ANY($1)", erased
    )
    if left or tombstones != len(erased):
        return [f"{len(erased)} erased: {left} events left, {tombstones} tombstones"]
    return []


# ---- the verdicts and the summary ------------------------------------------------------------


def _verdicts(samples: list[Sample]) -> list[Growth | Pace]:
    found: list[Growth | Pace] = []
    for name, ceiling in (("server", SERVER_CONNECTIONS), ("worker", WORKER_CONNECTIONS)):
        prints: list[Footprint] = [getattr(sample, name) for sample in samples]
        found.append(
            growth(
                f"{name} RSS",
                [mib(p.rss_kib) for p in prints],
                allowed=RSS_SLACK_MIB,
                unit=" MiB",
            )
        )
        found.append(
            growth(
                f"{name} descriptors other than database connections",
                [float(p.fds - p.pg_connections) for p in prints],
                allowed=FD_SLACK,
            )
        )
        found.append(
            growth(
                f"{name} database connections",
                [float(p.pg_connections) for p in prints],
                allowed=None,
                ceiling=ceiling,
            )
        )
    found.append(
        growth(
            "the database's backends",
            [float(sample.backends) for sample in samples],
            allowed=None,
            ceiling=SERVER_CONNECTIONS + WORKER_CONNECTIONS + 1,  # and the sampler's
        )
    )
    found.append(pace("appends", [s.appends for s in samples], kept=PACE_KEPT))
    found.append(pace("compactions", [s.compactions for s in samples], kept=PACE_KEPT))
    return found


def _summary(
    tally: Tally,
    samples: list[Sample],
    verdicts: list[Growth | Pace],
    loaded: float,
    outcomes: dict[str, int],
    summarizer_calls: int,
    wall: float,
) -> str:
    warm_end = samples[len(samples) // 3]
    grew = {v.what: v.grew for v in verdicts if isinstance(v, Growth)}
    parts = []
    for name in ("server", "worker"):
        prints: list[Footprint] = [getattr(sample, name) for sample in samples]
        after: list[Footprint] = prints[len(prints) // 3 :]
        parts.append(
            f"{name} RSS {mib(getattr(warm_end, name).rss_kib)} -> {mib(prints[-1].rss_kib)} MiB "
            f"(last third's peak {grew[f'{name} RSS']:+.1f} over the middle's), "
            f"fds {min(p.fds for p in after)}-{max(p.fds for p in after)} (other than "
            f"connections {grew[f'{name} descriptors other than database connections']:+g}), "
            f"pg connections {min(p.pg_connections for p in after)}-"
            f"{max(p.pg_connections for p in after)}"
        )
    paces = [v for v in verdicts if isinstance(v, Pace)]
    parts.append(
        "pace kept " + ", ".join(f"{v.what} {v.last / max(v.middle, 1):.0%}" for v in paces)
    )
    backends = [sample.backends for sample in samples[len(samples) // 3 :]]
    flat = "flat" if all(v.ok for v in verdicts) else "NOT flat"
    return (
        f"\nT19: {loaded:.0f} s of load ({wall:.0f} s in all), {len(samples)} samples; "
        f"{tally.appends} appends acknowledged ({tally.messages} messages), {tally.loads} loads "
        f"({tally.not_modified} x 304), {tally.reads} reads, "
        f"{outcomes.get('succeeded', 0)} compactions ({summarizer_calls} summarizer calls, "
        f"outcomes {dict(sorted(outcomes.items()))}), {tally.erasures} erasures "
        f"({tally.racing} racing the writers), {tally.created} conversations created, "
        f"{tally.audits} audits of {tally.audited_messages} acknowledged messages "
        f"({tally.boundaries_seen} boundaries seen); {len(tally.lost)} lost, "
        f"{len(tally.duplicated)} duplicated, {len(tally.untyped)} untyped, "
        f"{len(tally.unexpected)} unexpected; {tally.excused_404} x 404 and "
        f"{tally.excused_unacked} unacknowledged appends excused by racing erasures, "
        f"{tally.retried_503} x 503 retried, {tally.transport_errors} network errors retried; "
        f"{flat}: " + "; ".join(parts) + f"; database backends {min(backends)}-{max(backends)}"
    )


def _write_samples(samples: list[Sample], path: Path) -> None:
    """The samples as CSV beside the processes' logs (a failure's message names the
    directory)."""
    lines = ["seconds,process,rss_kib,fds,pg_connections,database_backends"]
    for sample in samples:
        for name in ("server", "worker"):
            p: Footprint = getattr(sample, name)
            lines.append(
                f"{sample.at:.1f},{name},{p.rss_kib},{p.fds},{p.pg_connections},{sample.backends}"
            )
    path.write_text("\n".join(lines) + "\n")


def _status_of_kind(kind: str) -> int | None:
    """The status of the ``episodic.errors`` class named ``kind`` (None: no such class)."""
    cls = getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.EpisodicError)):
        return None
    return next((status for base, status in STATUS_OF if issubclass(cls, base)), 500)


def _problem_kind(response: httpx.Response) -> str | None:
    """The ``episodic.errors`` class a problem+json answer names, or None."""
    if not response.headers.get("content-type", "").startswith(PROBLEM_MEDIA_TYPE):
        return None
    try:
        kind = response.json().get("type", "")
    except ValueError:
        return None
    if not isinstance(kind, str) or not kind.startswith(TYPE_PREFIX):
        return None
    return kind.removeprefix(TYPE_PREFIX)


def _quiet(conversation: Conversation) -> Callable[[], bool]:
    return lambda: conversation.in_flight == 0


def _text(rng: random.Random, key: str, words: int) -> str:
    return f"{key}: " + " ".join(rng.choices(WORDS.split(), k=words))
