"""T18, a full disk (issue 37), PostgreSQL.

Scenario. The test owns a cluster (tests/support_cluster.py) and mounts a VOLUME_MB tmpfs,
owned by the ``postgres`` OS user, as a tablespace; the test's database is created in it, so
every episodic table and index (and the database's own catalogs) live on the small volume
while the WAL stays on the big disk. (A full ``pg_wal`` is no error PostgreSQL reports: the
server PANICs and restarts, which clients see as dropped connections; that is the
crash-restart battery's territory, T14.) One compaction runs first, so the attempts ledger
has a page with some room, and DUE conversations are made due. A ballast file fills the
volume but for ROOM_BYTES; one-message appends (client ids and keys that sort in order, as
a log's do) fill that room until one is refused; then the three small shapes below in turn
until SETTLE rounds in a row are refused (a write that still fits, in room an index page had
or a refused write left, is whole and acknowledged like any other). Then, with the
volume full: REFUSED_APPENDS writes of five shapes (one message, a batch of 5, a keyed one,
a 12 KB message stored out of line, a new conversation with 12 KB of metadata), one append
over HTTP (the app in process) and one ``episodic import`` on the command line. Then an
in-process CompactionWorker (concurrency 1, max_attempts 2, backoff 0.1 s doubling to
0.3 s, lease 1 s, a summarizer that always answers) works against the full volume for at
least FULL_SECONDS and until it has had attempts of both kinds: recorded while the ledger's
last page has room, unrecorded once it has none. Then the ballast is deleted.

What really happens on a full volume: a write that needs a new page anywhere (the table, an
index, the TOAST table) fails with SQLSTATE 53100 and its transaction is rolled back; a
write that fits in pages the table already has succeeds (claims and head updates do: a
head row is updated in place). A worker's attempt reaches the summarizer (one call), then
its boundary write is refused; its failure is recorded with its backoff while the ledger
has room, and once it has none the record is refused too, so the lease's expiry is the
backoff.

Pass criteria:
- every write while the volume is full raises ``StorageFullError`` (SQLSTATE 53100,
  translated; never a driver error, never another class); over HTTP a 503 problem of type
  ``.../errors/StorageFullError`` with ``Retry-After`` and the fixed public sentence; the
  CLI prints one line ``error: the database server is out of disk space (...)`` and exits 1.
- nothing partial: every episodic table is identical before and after the refused writes;
  the busy conversation's log is exactly the acknowledged appends, none of a refused one,
  at seqs 1..n without a gap after the recovery; every head's counters equal the ones
  rebuilt from its log.
- the worker backs off and stays up: every attempt while full failed for the full disk,
  recorded as ``failed`` with a retry delay within +-10% of min(0.1 * 2**(attempt-1), 0.3),
  or unrecorded; no conversation is claimed again before its delay (or, unrecorded, its
  lease) ran out; after each such failure the worker claims nothing for a pause of the same
  formula, counted in failures in a row (so a full disk costs one summarizer call per pause,
  not one per due conversation); attempts pass max_attempts and no conversation becomes
  dead; no traceback is logged; the worker never stops.
- after the ballast is deleted an append succeeds within RESUME_BOUND s, and every due
  conversation has its one boundary within COMPACT_BOUND s.

Needs root (to mount the tmpfs) and the PostgreSQL 15 server binaries; skipped without them,
failed instead where EPISODIC_TEST_REQUIRE_EXTRAS=1 (CI, which runs as root). The volume is
unmounted however the test ends.

Run:
    EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/pytest tests/reliability/test_t18_full_disk.py -q -s
(EPISODIC_TEST_NIGHTLY=1: 400 refused writes, at least 30 s of full volume for the worker.)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pwd
import random
import string
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest
from sqlalchemy.engine import make_url

from episodic import EpisodicStore, Message, StorageFullError
from episodic.models import BoundaryEvent, MessageEvent
from episodic.policy import EpisodicCompactionConfig
from episodic.server import create_app
from episodic.server.disclosure import PUBLIC_DETAILS
from episodic.server.keys import KeyStore
from episodic.settings import EpisodicSettings
from episodic.store.attempts import AttemptEnd, AttemptRecord, Claim
from episodic.store.projection import rebuild_head
from episodic.worker import CompactionOptions, CompactionWorker
from episodic.worker.backoff import JITTER
from tests.acceptance.test_cli import clean_env, run_cli_async
from tests.reliability.sizes import size
from tests.reliability.strategies import FakeSummarizer
from tests.support import FILE_LISTING, REQUIRE_EXTRAS, asyncpg_dsn, counters_of, snapshot
from tests.support_cluster import Cluster, private_cluster

pytestmark = pytest.mark.postgres_only

VOLUME_MB = 32
#: left free by the ballast, for the first appends to fill
ROOM_BYTES = 192 * 1024
REFUSED_APPENDS = size(40, 400)
#: the worker runs against the full volume at least this long, and until it has had attempts
#: of both kinds (recorded while the ledger's last page has room, unrecorded once it is full,
#: and one claimed again after an unrecorded one)
FULL_SECONDS = float(size(3, 30))
FULL_BOUND = FULL_SECONDS + 30.0
TENANT = "acme"
#: due conversations the worker compacts
DUE = 3
MAX_ATTEMPTS = 2
BASE, CAP = 0.1, 0.3
LEASE = 1.0
POLL = 0.1
RESUME_BOUND = 5.0
COMPACT_BOUND = LEASE + CAP + 5.0
#: the worker's clock (time.monotonic) against the database's now(): one host, so a few ms
SLACK = 0.05
FILL_LIMIT = 10_000
#: rounds of the small shapes, all refused in a row, that say the volume is full (not
#: merely the page one index writes to)
SETTLE = 5
PROBLEM_TYPE = "https://episodic.dev/errors/StorageFullError"
FULL_DETAIL = dict(PUBLIC_DETAILS)[StorageFullError]


def _refuse_to_run(reason: str) -> None:
    if REQUIRE_EXTRAS:
        pytest.fail(f"T18 cannot run: {reason}; EPISODIC_TEST_REQUIRE_EXTRAS=1", pytrace=False)
    pytest.skip(f"T18 {reason}")


@dataclass
class SmallVolume:
    """The cluster and the tmpfs its test database lives on."""

    cluster: Cluster
    path: Path
    ballast: Path

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, *, leave: int) -> None:
        """Grow the ballast until only ``leave`` bytes are free."""
        grow = self.free_bytes() - leave
        if grow <= 0:
            return
        with self.ballast.open("ab") as handle:
            os.posix_fallocate(handle.fileno(), handle.tell(), grow)

    def empty(self) -> None:
        self.ballast.unlink()


def _mount(path: Path) -> None:
    owner = pwd.getpwnam("postgres")
    options = f"size={VOLUME_MB}M,mode=0700,uid={owner.pw_uid},gid={owner.pw_gid}"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "t18", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        _refuse_to_run(f"could not mount a tmpfs: {done.stderr.strip() or done.returncode}")


def _unmount(path: Path) -> None:
    for attempt in range(50):
        done = subprocess.run(["umount", str(path)], capture_output=True, check=False)
        if done.returncode == 0 or not os.path.ismount(path):
            return
        time.sleep(0.1 * min(attempt + 1, 5))
    subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=False)


@pytest.fixture
def volume() -> Iterator[SmallVolume]:
    if os.geteuid() != 0:
        _refuse_to_run("needs root, to mount a small tmpfs for PostgreSQL to fill")
    with private_cluster() as cluster:
        path = cluster.root / "small"
        path.mkdir()
        _mount(path)
        try:
            yield SmallVolume(cluster, path, path / "ballast")
        finally:
            cluster.stop()  # the server lets go of its files on the volume first
            _unmount(path)


def _url(cluster: Cluster, database: str) -> str:
    return make_url(cluster.url()).set(database=database).render_as_string(hide_password=False)


def _noise(n: int, seed: int) -> str:
    """Text that compresses badly, so PostgreSQL stores it out of line (TOAST)."""
    rng = random.Random(seed)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=n))


@dataclass
class Attempt:
    """One claim the worker made, and how its attempt ended."""

    conversation_id: UUID
    attempt: int
    claimed: float
    ended: float | None = None
    #: what end_attempt recorded, or "unrecorded" when recording failed too (None: the
    #: attempt wrote its boundary, which records it, or had not ended)
    outcome: str | None = None
    retry_in: float | None = None
    error: str | None = None


@dataclass
class WorkerWatch:
    """What the worker did, seen through the store's claim_due and end_attempt (class
    attributes, so the tenant-scoped store the worker derives per claim is watched too)."""

    attempts: dict[UUID, Attempt] = field(default_factory=dict)  # by lease token
    refused_claims: int = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        claim_due = EpisodicStore.claim_due
        end_attempt = EpisodicStore.end_attempt
        watch = self

        async def watched_claim(
            self: EpisodicStore, owner: str, *, limit: int, lease_seconds: float
        ) -> list[Claim]:
            try:
                claims = await claim_due(self, owner, limit=limit, lease_seconds=lease_seconds)
            except StorageFullError:
                watch.refused_claims += 1
                raise
            now = time.monotonic()
            for claim in claims:
                watch.attempts[claim.lease_token] = Attempt(
                    claim.conversation_id, claim.attempt, now
                )
            return claims

        async def watched_end(
            self: EpisodicStore, claim: Claim, end: AttemptEnd, record: AttemptRecord
        ) -> Any:
            mine = watch.attempts[claim.lease_token]
            mine.error = record.error
            try:
                outcome = await end_attempt(self, claim, end, record)
            except StorageFullError:
                mine.ended, mine.outcome = time.monotonic(), "unrecorded"
                raise
            mine.ended, mine.outcome, mine.retry_in = time.monotonic(), outcome, end.retry_in
            return outcome

        monkeypatch.setattr(EpisodicStore, "claim_due", watched_claim)
        monkeypatch.setattr(EpisodicStore, "end_attempt", watched_end)

    def claims(self) -> list[Attempt]:
        return sorted(self.attempts.values(), key=lambda a: a.claimed)


@contextlib.asynccontextmanager
async def _running(worker: CompactionWorker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=10)


def _delay(attempt: int) -> float:
    return min(BASE * 2.0 ** (attempt - 1), CAP)


async def _export(postgres_url: str, path: Path) -> None:
    """A conversation with two 12 KB messages in an export file, written on the shared test
    server (the full database cannot take it: that is the point)."""
    store = await EpisodicStore.open(postgres_url, settings=EpisodicSettings(_env_file=None))
    try:
        cid = await store.create_conversation(tenant_id=TENANT)
        await store.append(
            cid, [Message.user(_noise(12_000, 1)), Message.assistant(_noise(12_000, 2))]
        )
        with path.open("w", encoding="utf-8") as out:
            async for line in store.export_conversation(cid):
                out.write(line)
    finally:
        await store.close()


@dataclass
class Appends:
    """The appends to the busy conversation. Client ids and idempotency keys sort after every
    earlier one, so each lands at the right end of its index, as a live log's do: once the
    pages there are full, every later write needs a new one."""

    acked: dict[str, int] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    made: int = 0
    keys: int = 0

    def messages(self, count: int = 1, *, text: str | None = None) -> list[Message]:
        batch = []
        for _ in range(count):
            self.made += 1
            client_id = f"m{self.made:06d}"
            batch.append(Message.user(text or f"message {client_id}", client_id=client_id))
        return batch

    def key(self) -> str:
        self.keys += 1
        return f"key-{self.keys:06d}"

    def ack(self, events: list[MessageEvent]) -> None:
        self.acked.update((e.message.client_id or "", e.seq) for e in events)


#: the writes of the refused phase; the first three need room in the busy log's pages (its
#: table and indexes), the other two in a TOAST table, which has no page with room at all
SHAPES = ("one message", "batch of 5", "keyed", "12 KB message", "new conversation")
SMALL_SHAPES = SHAPES[:3]


async def _write(store: EpisodicStore, busy: UUID, log: Appends, shape: str, n: int) -> bool:
    """One write of ``shape``: True when it was stored (and acknowledged), False when it was
    refused with StorageFullError; any other error propagates."""
    messages: list[Message] = []
    try:
        if shape == "new conversation":
            await store.create_conversation(tenant_id=TENANT, metadata={"notes": _noise(12_000, n)})
            return True
        key = None
        if shape == "one message":
            messages = log.messages()
        elif shape == "batch of 5":
            messages = log.messages(5)
        elif shape == "keyed":
            messages, key = log.messages(), log.key()
        else:
            messages = log.messages(text=_noise(12_000, n))
        log.ack(await store.append(busy, messages, idempotency_key=key))
        return True
    except StorageFullError:
        log.refused.update(m.client_id or "" for m in messages)
        return False


@dataclass
class Filled:
    filled_by: int
    reused: int
    first_refusal: str
    free: int


async def _fill(store: EpisodicStore, volume: SmallVolume, busy: UUID, log: Appends) -> Filled:
    """The ballast, then one-message appends until one is refused; then the small shapes in
    turn until SETTLE rounds in a row are all refused. Which page runs out first depends on
    the room each had: a key that goes to another index than the one that filled may still
    fit, and PostgreSQL reuses room a refused write left. Each write that fits is whole and
    acknowledged like any other."""
    volume.fill(leave=ROOM_BYTES)
    filled_by = 0
    while True:
        messages = log.messages()
        try:
            log.ack(await store.append(busy, messages))
        except StorageFullError as exc:
            log.refused.update(m.client_id or "" for m in messages)
            first_refusal = str(exc)
            break
        except Exception as exc:
            raise AssertionError(
                f"append {filled_by + 1} on the filling volume raised {type(exc).__module__}."
                f"{type(exc).__name__}, not StorageFullError: {exc}"
            ) from exc
        filled_by += 1
        assert filled_by < FILL_LIMIT, f"{FILL_LIMIT} appends and the volume is not full"
    reused = in_a_row = 0
    for n in range(FILL_LIMIT):
        if await _write(store, busy, log, SMALL_SHAPES[n % len(SMALL_SHAPES)], n):
            reused += 1
            in_a_row = 0
        else:
            in_a_row += 1
            if in_a_row == SETTLE * len(SMALL_SHAPES):
                return Filled(filled_by, reused, first_refusal, volume.free_bytes())
    raise AssertionError(f"{FILL_LIMIT} writes after the first refusal and still room")


async def _refused_writes(
    store: EpisodicStore, busy: UUID, log: Appends
) -> tuple[Counter[str], list[str]]:
    """REFUSED_APPENDS writes of every shape while the volume is full: how many of each were
    refused, and what any other did."""
    refusals: Counter[str] = Counter()
    unexpected: list[str] = []
    for n in range(REFUSED_APPENDS):
        shape = SHAPES[n % len(SHAPES)]
        try:
            stored = await _write(store, busy, log, shape, n)
        except Exception as exc:  # what T18 is about: any other class fails it
            unexpected.append(f"{shape}: {type(exc).__module__}.{type(exc).__name__}: {exc}")
            continue
        if stored:
            unexpected.append(f"{shape}: stored while the volume was full")
        else:
            refusals[shape] += 1
    return refusals, unexpected


async def _http_append(
    store: EpisodicStore, keys: KeyStore, secret: str, busy: UUID, log: Appends
) -> None:
    """One keyed append over HTTP: a 503 problem that names StorageFullError."""
    transport = httpx.ASGITransport(app=create_app(store, keys))
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://episodic",
        headers={"Authorization": f"Bearer {secret}"},
    ) as http:
        (message,) = log.messages(text="over HTTP")
        log.refused.add(message.client_id or "")
        answer = await http.post(
            f"/v1/conversations/{busy}/messages",
            json={
                "messages": [
                    {"role": "user", "content": message.text, "client_id": message.client_id}
                ]
            },
            headers={"Idempotency-Key": log.key()},
        )
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["retry-after"] == "1"
    problem = answer.json()
    assert (problem["type"], problem["detail"]) == (PROBLEM_TYPE, FULL_DETAIL), problem


async def _cli_import(url: str, export_file: Path, cwd: Path) -> str:
    """``episodic import`` of a conversation with 12 KB messages: one line, exit 1."""
    done = await run_cli_async(
        "import", str(export_file), "--tenant", TENANT,
        cwd=cwd, env=clean_env(EPISODIC_DATABASE_URL=url),
    )  # fmt: skip
    said = done.stderr.strip()
    assert done.code == 1, done.output
    assert "\n" not in said, said
    assert said.startswith("error: the database server is out of disk space ("), said
    assert "nothing was written" in said, said
    return said


def _both_kinds(watch: WorkerWatch) -> bool:
    """Whether the worker has had a recorded failure, and an unrecorded one after which the
    same conversation was claimed again (its lease expired) and that attempt ended too."""
    claims = watch.claims()
    retried = any(
        a.outcome == "unrecorded"
        and any(b.conversation_id == a.conversation_id and b.ended for b in claims[n + 1 :])
        for n, a in enumerate(claims)
    )
    return retried and any(a.outcome == "failed" for a in claims)


def _check_worker(during: list[Attempt]) -> Counter[str]:
    """The worker's attempts while the volume was full (one at a time, concurrency 1): each
    failed for the full disk, with the backoff it was due, or went unrecorded and waited out
    its lease; no conversation was claimed again before either ran out, and after each of
    these failures the worker claimed nothing for its own growing pause."""
    assert during, "the worker made no attempt while the volume was full"
    wrong = [a for a in during if a.outcome not in ("failed", "unrecorded")]
    assert not wrong, f"attempts that did not end failed or unrecorded: {wrong}"
    other = [a for a in during if not (a.error or "").startswith("StorageFullError: ")]
    assert not other, f"attempts that failed for something else than the full disk: {other}"
    low, high = 1 - JITTER - 0.001, 1 + JITTER + 0.001
    off = [
        a for a in during
        if a.outcome == "failed"
        and not low * _delay(a.attempt) <= (a.retry_in or 0.0) <= high * _delay(a.attempt)
    ]  # fmt: skip
    assert not off, f"retry delays off min({BASE} * 2**(attempt-1), {CAP}) +-10%: {off}"
    early = []
    for conv in {a.conversation_id for a in during}:
        mine = [a for a in during if a.conversation_id == conv]
        for previous, following in itertools.pairwise(mine):
            assert previous.ended is not None
            if previous.outcome == "failed":
                earliest = previous.ended + (previous.retry_in or 0.0) - SLACK
            else:  # unrecorded: the lease has to expire first
                earliest = previous.claimed + LEASE - SLACK
            if following.claimed < earliest:
                early.append((previous, following))
    assert not early, f"claimed again before the backoff or the lease ran out: {early}"
    hasty = []
    for streak, (previous, following) in enumerate(itertools.pairwise(during), start=1):
        assert previous.ended is not None
        if following.claimed < previous.ended + (1 - JITTER) * _delay(streak) - SLACK:
            hasty.append((streak, previous, following))
    assert not hasty, f"the worker did not pause its claims after a full disk: {hasty}"
    last = max(a.attempt for a in during)
    assert last > MAX_ATTEMPTS, f"only {last} attempts while full: not past max_attempts"
    return Counter(a.outcome or "" for a in during)


async def _check_logs(store: EpisodicStore, busy: UUID, due: list[UUID], log: Appends) -> None:
    """Nothing partial, nothing lost: the busy log is exactly the acknowledged appends, at
    seqs 1..n; every head's counters are its log's; one boundary each for the due ones, and
    no dead attempt."""
    events = await store.read_events(busy, limit=10_000)
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "a gap in the seqs"
    stored = {e.message.client_id: e.seq for e in events if isinstance(e, MessageEvent)}
    assert len(stored) == len(events), "a message without a client id, or one stored twice"
    assert stored == log.acked, "the log is not exactly the acknowledged appends"
    assert not log.refused & set(stored), "a message of a refused append is in the log"
    for conv in (busy, *due):
        events = await store.read_events(conv, limit=10_000)
        head = await store.get_conversation(conv)
        assert counters_of(head) == rebuild_head(events), conv
        assert head.last_seq == events[-1].seq, conv
        assert head.dead_since is None, conv
    for conv in due:
        boundaries = [e for e in await store.read_events(conv) if isinstance(e, BoundaryEvent)]
        assert len(boundaries) == 1, (conv, boundaries)
        ledger = await store.read_attempts(conv)
        assert "dead" not in {r.outcome for r in ledger}, ledger
        assert ledger[-1].outcome == "succeeded", ledger


def _worker(store: EpisodicStore, summarizer: FakeSummarizer) -> CompactionWorker:
    return CompactionWorker(
        store,
        summarizer,
        concurrency=1,
        options=CompactionOptions(
            summarizer_timeout=5.0, max_attempts=MAX_ATTEMPTS, backoff_base=BASE, backoff_max=CAP
        ),
        lease_seconds=LEASE,
        poll_interval=POLL,
        sweep_interval=3600.0,
        shutdown_grace=1.0,
        worker_id="t18-worker",
    )


async def _make_due(store: EpisodicStore, conv: UUID, tag: str) -> None:
    """A finished exchange with a tool-sized answer, appended under a trigger that makes it
    due at once."""
    quiet = store.trigger
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
    try:
        await store.append(
            conv,
            [
                Message.user(f"{tag}: list the files"),
                Message.assistant(f"{tag}: three files:\n{FILE_LISTING}"),
                Message.user(f"{tag}: summarise the largest"),
                Message.assistant(f"{tag}: a sales report"),
            ],
        )
    finally:
        store.trigger = quiet
    assert (await store.get_conversation(conv)).due_since is not None


async def _setup(store: EpisodicStore, keys: KeyStore) -> tuple[UUID, list[UUID], str]:
    """The busy conversation the appends go to (never due), DUE conversations the worker
    compacts, and a key. One compaction runs first, so that the attempts ledger has a page
    with room: the worker's first failures on the full volume can be recorded, the later
    ones not (as on a real volume that fills)."""
    await store.migrate()
    _, secret = await keys.create(TENANT)
    store.trigger = EpisodicCompactionConfig(
        trigger_context_tokens=None, trigger_unfinished_turns=1_000_000
    )
    busy = await store.create_conversation(tenant_id=TENANT)
    warm = await store.create_conversation(tenant_id=TENANT)
    await _make_due(store, warm, "warm")
    (result,) = await _worker(store, FakeSummarizer()).run_once()
    assert result.outcome == "succeeded", result
    due = [await store.create_conversation(tenant_id=TENANT) for _ in range(DUE)]
    for n, conv in enumerate(due):
        await _make_due(store, conv, f"due {n}")
    return busy, due, secret


async def test_t18_a_full_disk_refuses_writes_with_one_typed_error_and_everything_resumes(
    volume: SmallVolume,
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = time.monotonic()
    admin = await asyncpg.connect(asyncpg_dsn(volume.cluster.url()))
    try:
        await admin.execute(f"CREATE TABLESPACE small LOCATION '{volume.path}'")
        await admin.execute("CREATE DATABASE episodic_t18 TABLESPACE small")
    finally:
        await admin.close()
    url = _url(volume.cluster, "episodic_t18")
    export_file = tmp_path / "export.ndjson"
    await _export(postgres_url, export_file)

    store = await EpisodicStore.open(url, settings=EpisodicSettings(_env_file=None))
    keys = KeyStore.open(url)
    try:
        busy, due, secret = await _setup(store, keys)
        log = Appends()

        # ---- the volume fills; then every write is refused, typed, and writes nothing ------
        filled = await _fill(store, volume, busy, log)
        before = await snapshot(url)
        refusals, unexpected = await _refused_writes(store, busy, log)
        await _http_append(store, keys, secret, busy, log)
        refusals["HTTP append"] += 1
        cli_line = await _cli_import(url, export_file, tmp_path)
        refusals["CLI import"] += 1
        assert not unexpected, (
            f"{len(unexpected)} writes not refused with StorageFullError: {unexpected[:5]}"
        )
        assert await snapshot(url) == before, "a refused write changed a table"

        # ---- the worker against the full volume; then the ballast goes ---------------------
        watch = WorkerWatch()
        watch.install(monkeypatch)
        summarizer = FakeSummarizer()
        with caplog.at_level(logging.INFO, logger="episodic.worker"):
            async with _running(_worker(store, summarizer)) as running:
                worked = time.monotonic()
                while not (time.monotonic() - worked >= FULL_SECONDS and _both_kinds(watch)):
                    dead = [a for a in watch.claims() if a.outcome == "dead"]
                    assert not dead, f"a conversation became dead for a full disk: {dead[0]}"
                    assert not running.done(), f"the worker stopped: {running}"
                    assert time.monotonic() - worked < FULL_BOUND, (
                        f"no attempts of both kinds in {FULL_BOUND:g} s: {watch.claims()[-3:]}"
                    )
                    await asyncio.sleep(0.05)
                full_for = time.monotonic() - worked
                during = [a for a in watch.claims() if a.ended is not None]
                calls_while_full = summarizer.calls
                for conv in due:
                    head = await store.get_conversation(conv)
                    assert head.dead_since is None, f"dead for a full disk: {head.last_error}"
                    assert head.boundary_seq is None, "a boundary was written on a full volume"
                assert not running.done(), f"the worker stopped: {running}"
                freed = time.monotonic()
                volume.empty()
                while not await _write(store, busy, log, "one message", 0):
                    assert time.monotonic() - freed < RESUME_BOUND, "appends did not resume"
                    await asyncio.sleep(0.05)
                resumed = time.monotonic() - freed
                for conv in due:
                    while (await store.get_conversation(conv)).boundary_seq is None:
                        assert time.monotonic() - freed < COMPACT_BOUND, (
                            f"no boundary {COMPACT_BOUND:g} s after the volume was freed: "
                            f"{watch.claims()[-3:]}"
                        )
                        await asyncio.sleep(0.05)
                compacted = time.monotonic() - freed
                assert not running.done(), f"the worker stopped: {running}"
        outcomes = _check_worker(during)
        tracebacks = [
            r.getMessage() for r in caplog.records
            if r.name == "episodic.worker" and r.exc_info is not None
        ]  # fmt: skip
        assert not tracebacks, f"the worker logged tracebacks for a full disk: {tracebacks[:3]}"
        await _check_logs(store, busy, due, log)
    finally:
        await keys.close()
        await store.close()

    shapes = ", ".join(f"{kind} {count}" for kind, count in sorted(refusals.items()))
    ends = ", ".join(f"{kind} {count}" for kind, count in sorted(outcomes.items()))
    print(
        f"\nT18: a {VOLUME_MB} MB volume full after {filled.filled_by} appends "
        f"({filled.reused} more fitted after the first refusal; {filled.free:,} bytes "
        f"free); {sum(refusals.values())} writes refused with StorageFullError ({shapes}), "
        f"0 other errors, 0 rows changed. The worker, {full_for:.1f} s on the full volume: "
        f"{len(during)} attempts on {DUE} conversations ({ends}; up to attempt "
        f"{max(a.attempt for a in during)}, max_attempts {MAX_ATTEMPTS}, 0 dead), "
        f"{calls_while_full} summarizer calls, {watch.refused_claims} claims refused. "
        f"Appends resumed {resumed:.2f} s after the ballast was deleted, every due "
        f"conversation compacted {compacted:.2f} s after; {time.monotonic() - started:.1f} s "
        f"in all.\n  the store said: {filled.first_refusal}\n  the CLI said: {cli_line}"
    )
