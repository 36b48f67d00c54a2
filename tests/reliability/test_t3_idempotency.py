"""T3, idempotency under an unknown outcome (PostgreSQL).

Scenario. A client appends through :class:`FaultProxy`, a TCP proxy that cuts the connection
at a random byte of the request or of the reply, or right after the request's Sync reached the
server (the server commits, the client never hears). A cut inside the reply to an append falls
after the commit and before the client read its result. Each append is keyed, by an
``idempotency_key``, by its messages' ``client_id`` (the first one keys the batch), or by both;
a quarter also pass ``expected_seq``. The client retries each append with the same key and
batch, up to 5 times, on ``TransientDatabaseError``. The store itself retries keyed appends
up to 3 times (``episodic/store/retry.py``), so one client call is up to 15 attempts on the
wire. About 2% of appends meet a lasting outage (every attempt cut), so all 5 client tries fail:
those are ``info`` operations, whose outcome the client does not know. Then the KurrentDB
sequences are replayed on a connection that is not cut.

Pass criteria (all asserted and counted):

* 0 duplicates: no message is stored twice.
* 0 lost ``ok`` appends: every append that returned is stored, each message at the seq it
  returned, as one contiguous block.
* each ``info`` append is present 0 or 1 times, and all or nothing of its batch.
* every retry that succeeds returns the original seq (the one the database holds), including
  after a cut that fell after the commit (``post_commit``) and a cut after Sync.
* seqs in each conversation are 1..n with 0 gaps; rows = ok messages + present info messages.
* 0 unexpected exceptions: only ``TransientDatabaseError`` reaches the client.
* KurrentDB sequences: the same key with its original ``expected_seq`` returns the original
  result; the same key with the current seq returns the original result; the same key with a
  stale seq returns the original result; each writes nothing. A batch holding one client id
  twice is refused with ``ValidationError`` before any SQL (0 protocol messages sent, rows
  unchanged). A stale ``expected_seq`` raises ``ConflictError`` with the actual seq and never
  writes a row, however often it is repeated. The same key with another batch raises
  ``IdempotencyMismatchError``.

Run:
    cd /work/main && \\
    EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/pytest tests/reliability/test_t3_idempotency.py -x -q -s
(add ``EPISODIC_TEST_NIGHTLY=1`` for 5,000 appends).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import asyncpg
import orjson
import pytest
from sqlalchemy.engine import make_url

from episodic import (
    ConflictError,
    EpisodicSettings,
    EpisodicStore,
    IdempotencyMismatchError,
    Message,
    MessageEvent,
    TransientDatabaseError,
    ValidationError,
)
from tests.reliability.fault_proxy import FaultProxy
from tests.reliability.sizes import NIGHTLY, seeded, seeds, size
from tests.support import asyncpg_dsn, store_through_proxy

APPENDS = size(300, 5_000)
CONVERSATIONS = 3
CLIENT_TRIES = 5
#: one client call of a keyed append is at most this many attempts on the wire
STORE_TRIES = 3
#: share of appends that meet a lasting outage (each costs ~1 s of store and client backoff)
OUTAGE_RATE = 0.02
#: a hang is a failure too: no single client call may take longer than this
CALL_TIMEOUT = 30.0


async def _rows(url: str) -> list[tuple[UUID, int, str, str | None, str | None]]:
    """Every message row, straight from the table (not through the store)."""
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT conversation_id, seq, payload, client_id, idempotency_key"
            "  FROM episodic_events WHERE kind = 'message' ORDER BY conversation_id, seq"
        )
    finally:
        await connection.close()
    return [
        (r["conversation_id"], r["seq"], r["payload"], r["client_id"], r["idempotency_key"])
        for r in rows
    ]


async def _last_seqs(url: str) -> dict[UUID, int]:
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT conversation_id, last_seq FROM episodic_conversations"
        )
    finally:
        await connection.close()
    return {r["conversation_id"]: r["last_seq"] for r in rows}


def _text_of(payload: Any) -> str:
    data = orjson.loads(payload) if isinstance(payload, str | bytes) else payload
    content = data.get("content")
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content or [])


@dataclass
class Op:
    index: int
    conversation: UUID
    keying: str
    texts: list[str]
    expected_seq: int | None
    faults: int
    outage: bool
    outcome: str = "pending"  # ok | info | error
    seqs: list[int] = field(default_factory=list)
    client_tries: int = 0
    cuts: int = 0
    post_commit_cuts: int = 0
    after_sync_cuts: int = 0
    error: str | None = None
    elapsed: float = 0.0


@pytest.fixture
async def proxied(postgres_url: str) -> AsyncIterator[tuple[EpisodicStore, FaultProxy]]:
    target = make_url(postgres_url)
    proxy = FaultProxy(target.host or "127.0.0.1", target.port or 5432)
    port = await proxy.start()
    settings = EpisodicSettings(_env_file=None, pool_min_size=1, pool_max_size=1)
    store = await EpisodicStore.open(proxy.url_through(postgres_url, port), settings=settings)
    try:
        yield store, proxy
    finally:
        proxy.disarm()
        await store.close()
        await proxy.stop()


def _messages(op: Op) -> list[Message]:
    with_ids = op.keying in ("client_id", "both")
    return [
        Message.user(text, client_id=f"c{op.index}-{part}" if with_ids else None)
        for part, text in enumerate(op.texts)
    ]


async def _append_with_retries(store: EpisodicStore, op: Op) -> list[MessageEvent]:
    """The client: the same call, same key and batch, up to CLIENT_TRIES times."""
    key = f"k{op.index}" if op.keying in ("key", "both") else None
    batch = _messages(op)
    last: TransientDatabaseError | None = None
    for attempt in range(1, CLIENT_TRIES + 1):
        op.client_tries = attempt
        try:
            return await asyncio.wait_for(
                store.append(
                    op.conversation, batch, idempotency_key=key, expected_seq=op.expected_seq
                ),
                CALL_TIMEOUT,
            )
        except TransientDatabaseError as exc:
            last = exc
            await asyncio.sleep(0.005)
    assert last is not None
    raise last


def _draw_faults(rng: Any, typical: dict[str, int], outage: bool, count: int) -> list[Any]:
    plans = []
    for n in range(count):
        if outage and n > 0:
            # A lasting outage: every later attempt is cut early in its traffic (the
            # reconnect's startup packet, or the request), so none reaches a result.
            plans.append(FaultProxy.bytes_fault("c2s", rng.randrange(0, 40)))
            continue
        mode = rng.random()
        if mode < 0.4:
            plans.append(FaultProxy.bytes_fault("s2c", rng.randrange(0, typical["s2c"] + 1)))
        elif mode < 0.8:
            plans.append(FaultProxy.bytes_fault("c2s", rng.randrange(0, typical["c2s"] + 1)))
        else:
            plans.append(FaultProxy.after_sync_fault())
    return plans


@pytest.mark.parametrize("seed", seeds(1, 1))
async def test_t3_keyed_appends_survive_random_cuts(
    seed: int,
    postgres_url: str,
    proxied: tuple[EpisodicStore, FaultProxy],
    record_property: Any,
) -> None:
    store, proxy = proxied
    rng = seeded(seed)
    started = time.monotonic()
    convs = [await store.create_conversation() for _ in range(CONVERSATIONS)]

    # Measure one append's traffic on a warm connection, so cut offsets fall inside it.
    await store.append(convs[0], [Message.user(f"warmup seed {seed}")], idempotency_key="w0")
    before = dict(proxy.forwarded)
    await store.append(convs[0], [Message.user(f"warmup 2 seed {seed}")], idempotency_key="w1")
    typical = {d: proxy.forwarded[d] - before[d] for d in ("c2s", "s2c")}
    assert typical["c2s"] > 0, typical
    assert typical["s2c"] > 0, typical

    heads: dict[UUID, int | None] = {c: 0 for c in convs}
    heads[convs[0]] = 2
    ops: list[Op] = []
    unexpected: list[str] = []
    for index in range(APPENDS):
        conv = convs[rng.randrange(CONVERSATIONS)]
        keying = rng.choice(("key", "client_id", "both"))
        parts = rng.choice((1, 1, 1, 2, 3))
        expected = None
        if rng.random() < 0.25:
            if heads[conv] is None:  # after an unknown outcome the client re-reads the head
                heads[conv] = (await _last_seqs(postgres_url))[conv]
            expected = heads[conv]
        roll = rng.random()
        outage = roll < OUTAGE_RATE
        if outage:
            faults = CLIENT_TRIES * STORE_TRIES + 2
        elif roll < 0.8:
            faults = 0
        elif roll < 0.92:
            faults = 1
        else:
            faults = rng.randint(2, 4)
        op = Op(
            index=index,
            conversation=conv,
            keying=keying,
            texts=[f"seed {seed} op {index} part {p}" for p in range(parts)],
            expected_seq=expected,
            faults=faults,
            outage=outage,
        )
        ops.append(op)
        cuts_before = sum(proxy.cuts.values())
        post_before = proxy.post_commit_cuts
        sync_before = proxy.cuts["after_sync"]
        proxy.arm_sequence(_draw_faults(rng, typical, outage, faults))
        op_started = time.monotonic()
        try:
            events = await _append_with_retries(store, op)
        except TransientDatabaseError as exc:
            op.outcome = "info"
            op.error = f"{type(exc).__name__}: {exc}"
            heads[conv] = None
        except Exception as exc:  # anything else is a failure of the guarantee
            op.outcome = "error"
            op.error = f"{type(exc).__name__}: {exc}"
            unexpected.append(f"op {index}: {op.error}")
            heads[conv] = None
        else:
            op.outcome = "ok"
            op.seqs = [e.seq for e in events]
            heads[conv] = op.seqs[-1]
        finally:
            proxy.disarm()
        op.elapsed = time.monotonic() - op_started
        op.cuts = sum(proxy.cuts.values()) - cuts_before
        op.post_commit_cuts = proxy.post_commit_cuts - post_before
        op.after_sync_cuts = proxy.cuts["after_sync"] - sync_before

    # ---- the database, read directly --------------------------------------------------------
    rows = await _rows(postgres_url)
    where: dict[str, list[tuple[UUID, int]]] = defaultdict(list)
    per_conv: dict[UUID, list[int]] = defaultdict(list)
    for conv, seq, payload, _client_id, _key in rows:
        where[_text_of(payload)].append((conv, seq))
        per_conv[conv].append(seq)

    duplicates = [text for text, places in where.items() if len(places) > 1]
    gaps = {
        str(conv): seqs for conv, seqs in per_conv.items() if seqs != list(range(1, len(seqs) + 1))
    }
    lost: list[str] = []
    wrong_seq: list[str] = []
    info_present: Counter[str] = Counter()
    partial_info: list[str] = []
    for op in ops:
        found = [where.get(text, []) for text in op.texts]
        if op.outcome == "ok":
            for part, (text, places) in enumerate(zip(op.texts, found, strict=True)):
                if not places:
                    lost.append(f"op {op.index} part {part}")
                elif places[0] != (op.conversation, op.seqs[part]):
                    wrong_seq.append(
                        f"op {op.index} part {part}: returned seq {op.seqs[part]}, "
                        f"stored at {places} ({text!r})"
                    )
            if op.seqs != list(range(op.seqs[0], op.seqs[0] + len(op.texts))):
                wrong_seq.append(f"op {op.index}: returned seqs {op.seqs} not contiguous")
        elif op.outcome == "info":
            present = [len(p) for p in found]
            if all(n == 0 for n in present):
                info_present["absent"] += 1
            elif all(n == 1 for n in present):
                info_present["present"] += 1
            else:
                partial_info.append(f"op {op.index}: copies per part {present}")

    ok_ops = [op for op in ops if op.outcome == "ok"]
    info_ops = [op for op in ops if op.outcome == "info"]
    expected_rows = 2 + sum(len(op.texts) for op in ok_ops)
    expected_rows += sum(len(op.texts) for op in info_ops if where.get(op.texts[0]))
    retried_ok = [op for op in ok_ops if op.cuts > 0]
    post_commit_ok = [op for op in ok_ops if op.post_commit_cuts > 0]
    after_sync_ok = [op for op in ok_ops if op.after_sync_cuts > 0]
    client_retried_ok = [op for op in ok_ops if op.client_tries > 1]
    elapsed = time.monotonic() - started

    summary = (
        f"T3 seed={seed}: {len(ops)} appends ({'nightly' if NIGHTLY else 'CI'}), "
        f"{sum(op.outage for op in ops)} met an outage, {len(ok_ops)} ok, {len(info_ops)} info "
        f"({info_present['present']} present, {info_present['absent']} absent), "
        f"{len(unexpected)} unexpected errors; cuts c2s={proxy.cuts['c2s']} "
        f"s2c={proxy.cuts['s2c']} after_sync={proxy.cuts['after_sync']} "
        f"(post-commit reply cuts {proxy.post_commit_cuts}), {proxy.connections} connections; "
        f"{len(retried_ok)} ok appends were cut at least once, {len(post_commit_ok)} after a "
        f"post-commit cut, {len(after_sync_ok)} after a cut after Sync, {len(client_retried_ok)} "
        f"needed a client retry; {len(rows)} rows (expected {expected_rows}); "
        f"{len(duplicates)} duplicates, {len(lost)} lost ok, {len(wrong_seq)} wrong seqs, "
        f"{len(partial_info)} partial info, {len(gaps)} conversations with gaps; slowest client "
        f"call {max(op.elapsed for op in ops):.2f} s; {elapsed:.1f} s"
    )
    print(summary)
    record_property("t3_summary", summary)

    context = f"seed={seed}: {summary}"
    assert unexpected == [], f"{context}\nunexpected: {unexpected[:10]}"
    assert duplicates == [], f"{context}\nduplicates: {duplicates[:10]}"
    assert lost == [], f"{context}\nlost: {lost[:10]}"
    assert wrong_seq == [], f"{context}\nwrong seqs: {wrong_seq[:10]}"
    assert partial_info == [], f"{context}\npartial info ops: {partial_info[:10]}"
    assert gaps == {}, f"{context}\ngaps: {gaps}"
    assert len(rows) == expected_rows, context
    # The run must have exercised what it claims to test.
    assert post_commit_ok, f"no append was retried after a post-commit cut: {context}"
    assert after_sync_ok, f"no append was retried after a cut after Sync: {context}"
    assert info_ops, f"no append ended with an unknown outcome: {context}"
    assert client_retried_ok, f"no append needed a client-level retry: {context}"


# ---- KurrentDB sequences -----------------------------------------------------------------------


async def test_t3_kurrentdb_sequences(postgres_url: str, record_property: Any) -> None:
    """Same key with its original expected seq, with the current seq and with a stale seq; an
    in-batch duplicate client id; a stale expected seq; a reused key with another batch."""
    checks: Counter[str] = Counter()
    async with store_through_proxy(postgres_url) as (store, counter):
        conv = await store.create_conversation()

        async def rows() -> list[tuple[Any, ...]]:
            return [r for r in await _rows(postgres_url) if r[0] == conv]

        # 1. same key (explicit idempotency key) with its original expected version
        first = Message.user("kurrent first", client_id="m-first")
        [original] = await store.append(conv, [first], idempotency_key="K1", expected_seq=0)
        assert original.seq == 1
        await store.append(conv, [Message.user("kurrent second")], expected_seq=1)
        snapshot = await rows()
        assert len(snapshot) == 2
        for expected in (0, 2, 1):  # original, current, stale: the first result every time
            [again] = await store.append(conv, [first], idempotency_key="K1", expected_seq=expected)
            assert (again.seq, again.message.text) == (1, "kurrent first"), expected
            assert again.created_at == original.created_at, expected
            assert await rows() == snapshot, f"a replay with expected_seq={expected} wrote"
            checks[f"key replay expected={expected}"] += 1
        [again] = await store.append(conv, [first], idempotency_key="K1")
        assert again.seq == 1
        assert await rows() == snapshot
        checks["key replay no expected"] += 1

        # 2. keyed by client ids only (the first message's client id keys the batch)
        batch = [Message.user("cid a", client_id="c-a"), Message.user("cid b", client_id="c-b")]
        stored = await store.append(conv, batch, expected_seq=2)
        assert [e.seq for e in stored] == [3, 4]
        await store.append(conv, [Message.user("kurrent fifth")])
        snapshot = await rows()
        for maybe in (2, 5, 3, None):  # original, current, stale, none
            replay = await store.append(conv, batch, expected_seq=maybe)
            assert [e.seq for e in replay] == [3, 4], maybe
            assert await rows() == snapshot, f"a client-id replay with expected={maybe} wrote"
            checks[f"client-id replay expected={maybe}"] += 1

        # 3. an in-batch duplicate client id: ValidationError before any SQL
        sent, trips = len(counter.messages), counter.round_trips
        for key in (None, "K-dup"):
            with pytest.raises(ValidationError) as refused:
                await store.append(
                    conv,
                    [
                        Message.user("dup 1", client_id="twice"),
                        Message.user("dup 2", client_id="twice"),
                    ],
                    idempotency_key=key,
                    expected_seq=5,
                )
            assert "twice" in str(refused.value)
            assert not isinstance(refused.value, IdempotencyMismatchError)
            checks["in-batch duplicate refused"] += 1
        assert (len(counter.messages), counter.round_trips) == (sent, trips), (
            "the in-batch duplicate reached the database"
        )
        assert await rows() == snapshot
        checks["in-batch duplicate: 0 protocol messages"] += 1

        # 4. a stale expected version: ConflictError, never a second row (repeat it)
        for attempt in range(3):
            with pytest.raises(ConflictError) as conflict:
                await store.append(
                    conv, [Message.user("stale")], idempotency_key="K-stale", expected_seq=3
                )
            assert (conflict.value.expected_seq, conflict.value.actual_seq) == (3, 5), attempt
            assert await rows() == snapshot, f"stale append wrote on try {attempt}"
            checks["stale expected refused"] += 1
        with pytest.raises(ConflictError):
            await store.append(conv, [Message.user("stale", client_id="c-stale")], expected_seq=4)
        assert await rows() == snapshot
        checks["stale expected refused"] += 1
        # the refused key was not consumed: with the right version it appends once
        [fresh] = await store.append(
            conv, [Message.user("stale")], idempotency_key="K-stale", expected_seq=5
        )
        assert fresh.seq == 6
        [fresh_again] = await store.append(
            conv, [Message.user("stale")], idempotency_key="K-stale", expected_seq=5
        )
        assert fresh_again.seq == 6
        assert len(await rows()) == 6
        checks["refused key usable later, once"] += 1

        # 5. the same key with another batch is not a retry
        snapshot = await rows()
        with pytest.raises(IdempotencyMismatchError):
            await store.append(conv, [Message.user("something else")], idempotency_key="K1")
        with pytest.raises(IdempotencyMismatchError):
            await store.append(conv, [Message.user("other", client_id="c-a")])
        assert await rows() == snapshot
        checks["key reuse with another batch refused"] += 2

    summary = "T3 KurrentDB sequences: " + ", ".join(f"{k} x{n}" for k, n in checks.items())
    print(summary)
    record_property("t3_kurrentdb", summary)
