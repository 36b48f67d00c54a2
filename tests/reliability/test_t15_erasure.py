"""T15 erasure: who may erase, and erasure racing writers and the compaction worker.

The database is owned and migrated by an ordinary role (``episodic_test_owner``) and the
applications log in as members of the runtime roles (tests/reliability/rls.py), as in
T11/T12: a superuser would bypass row-level security and the grants this checks.

Role matrix pass criteria: ``erase_conversation`` and ``erase_tenant`` as ``episodic_app``,
``episodic_worker`` and ``episodic_all_tenants`` (scoped and unscoped) raise
``ErasureDeniedError`` (SQLSTATE 42501 at the tombstone's INSERT) with every table's checksum
unchanged; an identity that cannot see the conversation (the app or the owner with no tenant,
the eraser scoped to another tenant) gets ``NotFoundError`` and changes nothing. A raw DELETE
of a conversation's events, attempts or head outside the erasure function is refused: 0A000
from the triggers for the eraser and the owner (even in a transaction that erased another
conversation), 42501 for the app, the worker and the all-tenants role. The eraser (unscoped
and scoped) and the owner (scoped: FORCE row-level security) erase: 0 rows left in every table
with a conversation_id column (found from the catalog, read by a superuser), exactly 1
tombstone each, naming the login that erased; the eraser erases a whole tenant too. SQLite
has no roles: any store erases.

Lease pass criteria (driven with a barrier): a worker whose summarizer is still running when
its conversation is erased ends the attempt "gone", leaving 0 rows (no attempt row).

T15 battery pass criteria: 8 writers append batches (half keyed, a keyed one retried once with
its key after NotFoundError or TransientDatabaseError) to 80 conversations (400 nightly) in two
tenants while a compaction worker compacts them and the eraser login erases 50 (250 nightly)
at random moments. Then: 0 rows left of the erased conversations in every table with a
conversation_id column, exactly 1 tombstone each; **0 untyped errors** (anything that is not
an ``EpisodicError``, in the writers or logged by the worker) and 0 unexpected typed ones;
writers see ``NotFoundError`` only for conversations whose erasure had begun, never for live
ones, and a keyed retry never brings an erased one back; every acknowledged append to an
erased conversation lies within what its tombstone counted (it landed before the erasure);
the conversations not erased are intact (seq gapless 1..last_seq, the head equals the fold of
the log, every acknowledged append present with its text); afterwards each writer's last keyed
append to an erased conversation raises ``NotFoundError`` and ``create_conversation`` of an
erased id raises ``ErasedConversationError``: 0 rows again.

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
     .venv/bin/pytest tests/reliability/test_t15_erasure.py -q -s
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg
import pytest

from episodic import (
    EpisodicError,
    EpisodicStore,
    ErasedConversationError,
    Erasure,
    ErasureDeniedError,
    Message,
    MessageEvent,
    NotFoundError,
    StateChange,
    StoredEvent,
    ToolCall,
    TransientDatabaseError,
)
from episodic.compaction import CompactionRequest
from episodic.policy import EpisodicCompactionConfig
from episodic.store.projection import rebuild_head
from episodic.summarizers import SummaryResult
from episodic.worker import CompactionOptions, CompactionWorker, WorkerMetrics
from tests.reliability.rls import (
    ALL_TENANTS,
    APP,
    ERASER,
    OWNER,
    WORKER,
    RlsDatabase,
    rls_database,
    settings,
)
from tests.reliability.sizes import seeded, seeds, size
from tests.support import FILE_LISTING, LoggedExceptions, counters_of

TENANTS = ("acme", "globex")
LEDGER = "episodic_erasures"
#: Every table a checksum covers (the ledger too: a refused erasure writes no tombstone).
CHECKED_TABLES = (
    "episodic_conversations",
    "episodic_events",
    "episodic_compaction_attempts",
    "episodic_shared_state",
    LEDGER,
)
#: What a conversation's rows are in, at least (the catalog may find more).
CONVERSATION_TABLES = {
    "episodic_conversations",
    "episodic_events",
    "episodic_compaction_attempts",
}
#: The tables whose DELETE only the erasure path may take.
GUARDED_TABLES = ("episodic_events", "episodic_compaction_attempts", "episodic_conversations")

WRITERS = 8
CONVERSATIONS = size(80, 400)
ERASED = size(50, 250)
#: The eraser's pause before each erasure, at most (seconds).
ERASER_PAUSE = 0.04
#: How long writers and the worker go on after the last erasure (seconds).
TAIL = 0.5
#: Worker outcomes that an erasure racing the worker may produce; anything else is a failure.
WORKER_OUTCOMES = {"succeeded", "nothing_to_compact", "gone", "conflict", "lease_lost"}


@pytest.fixture
async def rls(postgres_server: str, postgres_template: str) -> AsyncIterator[RlsDatabase]:
    # postgres_template: its migration, as a superuser, created the runtime group roles.
    async with rls_database(postgres_server) as database:
        yield database


class FakeSummarizer:
    """Answers at once, or after a short random pause (to let erasures land while the worker
    holds a lease)."""

    name = "fake"

    def __init__(self, pause: float = 0.0, seed: int = 0) -> None:
        self.pause = pause
        self.random = random.Random(seed)
        self.calls = 0

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        self.calls += 1
        if self.pause:
            await asyncio.sleep(self.random.uniform(0, self.pause))
        return SummaryResult(text=f"summary of {request.source_messages} messages")


async def _open(database: RlsDatabase, role: str, **overrides: object) -> EpisodicStore:
    return await EpisodicStore.open(database.url(role), settings=settings(**overrides))


def _round(tag: str, *, tool: bool) -> list[Message]:
    """One finished turn: a user message and its answer, with a tool call pair or not."""
    if not tool:
        return [Message.user(f"{tag} question"), Message.assistant(f"{tag} answer")]
    return [
        Message.user(f"{tag} question"),
        Message.assistant(None, tool_calls=[ToolCall(id=f"call-{tag}", name="f")]),
        Message.tool_result(f"call-{tag}", f"{tag} result:\n{FILE_LISTING}", name="f"),
        Message.assistant(f"{tag} answer"),
    ]


async def _seed(app: EpisodicStore, tenant: str, count: int) -> list[UUID]:
    """``count`` conversations of ``tenant``, each with shared state and two finished turns
    (enough to be due with ``trigger_unfinished_turns=2``)."""
    scoped = app.for_tenant(tenant)
    convs = []
    for index in range(count):
        conv = await scoped.create_conversation(
            metadata={"tenant": tenant},
            state=StateChange(shared={f"user:{tenant}{index}": {"secret": tenant}}),
        )
        for turn in range(2):
            await scoped.append(conv, _round(f"{tenant}.{index}.{turn}", tool=True))
        convs.append(conv)
    return convs


async def _admin(database: RlsDatabase) -> asyncpg.Connection:
    return await asyncpg.connect(database.admin_dsn())


async def _conversation_tables(connection: asyncpg.Connection) -> list[str]:
    """Every episodic table with a conversation_id column, from the catalog (a table added
    later cannot be forgotten), the ledger aside."""
    rows = await connection.fetch(
        "SELECT DISTINCT table_name FROM information_schema.columns "
        "WHERE column_name = 'conversation_id' AND table_schema = 'public' "
        "AND table_name LIKE 'episodic%' AND table_name <> $1 ORDER BY table_name",
        LEDGER,
    )
    tables = [row["table_name"] for row in rows]
    assert set(tables) >= CONVERSATION_TABLES, tables
    return tables


async def _rows_left(database: RlsDatabase, convs: Sequence[UUID]) -> dict[str, int]:
    """Rows of these conversations in every table with a conversation_id column, read by a
    superuser (row-level security hides nothing)."""
    connection = await _admin(database)
    try:
        return {
            table: await connection.fetchval(
                f"SELECT count(*) FROM {table} WHERE conversation_id = ANY($1::uuid[])",
                list(convs),
            )
            for table in await _conversation_tables(connection)
        }
    finally:
        await connection.close()


async def _tombstones(database: RlsDatabase, convs: Sequence[UUID]) -> Counter[UUID]:
    connection = await _admin(database)
    try:
        rows = await connection.fetch(
            f"SELECT conversation_id, count(*) AS n FROM {LEDGER} "
            "WHERE conversation_id = ANY($1::uuid[]) GROUP BY conversation_id",
            list(convs),
        )
    finally:
        await connection.close()
    found: Counter[UUID] = Counter({row["conversation_id"]: row["n"] for row in rows})
    return Counter({conv: found[conv] for conv in convs})


async def _counts(database: RlsDatabase) -> dict[str, tuple[int, str]]:
    """Rows and an md5 of every table, read by a superuser (RLS does not apply)."""
    connection = await _admin(database)
    try:
        out = {}
        for table in CHECKED_TABLES:
            row = await connection.fetchrow(
                f"SELECT count(*) AS n, md5(coalesce(string_agg(t::text, '|' ORDER BY t::text),"
                f" '')) AS digest FROM {table} t"
            )
            out[table] = (row["n"], row["digest"])
        return out
    finally:
        await connection.close()


async def _raw(database: RlsDatabase, role: str, tenant: str | None, *sql: str) -> object:
    """Statements as ``role`` in one transaction with ``tenant`` set (or none); the last
    one's rows."""
    connection = await asyncpg.connect(database.dsn(role))
    try:
        async with connection.transaction():
            if tenant is not None:
                await connection.execute(
                    "SELECT set_config('episodic.tenant_id', $1, true)", tenant
                )
            result: object = None
            for statement in sql:
                result = await connection.fetch(statement)
            return result
    finally:
        await connection.close()


async def _all_events(store: EpisodicStore, conv: UUID) -> list[StoredEvent]:
    events: list[StoredEvent] = []
    while page := await store.read_events(conv, after_seq=events[-1].seq if events else 0):
        events += page
    return events


# ---- the role matrix -----------------------------------------------------------------------


async def test_t15_only_the_eraser_and_the_owner_may_erase(rls: RlsDatabase) -> None:
    stores = {role: await _open(rls, role) for role in (APP, WORKER, ALL_TENANTS, ERASER, OWNER)}
    app, worker_store, all_tenants = stores[APP], stores[WORKER], stores[ALL_TENANTS]
    eraser, owner = stores[ERASER], stores[OWNER]
    a, b = TENANTS
    try:
        app.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
        convs = await _seed(app, a, 4)
        (kept,) = await _seed(app, b, 1)
        # Every conversation gets a boundary and an attempt row: something in every table.
        results = await CompactionWorker(
            worker_store,
            FakeSummarizer(),
            options=CompactionOptions(),
            worker_id="t15-worker",
        ).run_once()
        assert sorted(r.outcome for r in results) == ["succeeded"] * 5
        rows = await _rows_left(rls, [convs[0]])
        assert all(count > 0 for count in rows.values()), rows
        before = await _counts(rls)
        target = convs[0]
        denied = not_found = refused_sql = 0

        # 42501 at the tombstone's INSERT: ErasureDeniedError, nothing changes.
        refusing = {
            "app, scoped": app.for_tenant(a),
            "worker, scoped": worker_store.for_tenant(a),
            "worker, no tenant": worker_store,
            "all tenants, scoped": all_tenants.for_tenant(a),
            "all tenants, no tenant": all_tenants,
        }
        for label, store in refusing.items():
            with pytest.raises(ErasureDeniedError):
                await store.erase_conversation(target, reason=f"{label} tries")
            denied += 1
        for label, store in {**refusing, "app, no tenant": app}.items():
            with pytest.raises(ErasureDeniedError):
                await store.erase_tenant(a, reason=f"{label} tries the tenant")
            denied += 1
        # Identities that cannot see the conversation find nothing to erase.
        for label, store in {
            "app, no tenant": app,
            "owner, no tenant (FORCE RLS)": owner,
            "eraser, other tenant": eraser.for_tenant(b),
        }.items():
            with pytest.raises(NotFoundError):
                await store.erase_conversation(target, reason=f"{label} tries")
            not_found += 1
        assert await _counts(rls) == before, "a refused erasure changed a table"

        # DELETE outside the erasure function: the triggers (0A000) or the grants (42501).
        delete = "DELETE FROM {table} WHERE conversation_id = '{conv}'"
        for role, tenant, expected in (
            (ERASER, None, asyncpg.FeatureNotSupportedError),
            (ERASER, a, asyncpg.FeatureNotSupportedError),
            (OWNER, a, asyncpg.FeatureNotSupportedError),
            (APP, a, asyncpg.InsufficientPrivilegeError),
            (WORKER, a, asyncpg.InsufficientPrivilegeError),
            (ALL_TENANTS, None, asyncpg.InsufficientPrivilegeError),
        ):
            for table in GUARDED_TABLES:
                with pytest.raises(expected):
                    await _raw(rls, role, tenant, delete.format(table=table, conv=target))
                refused_sql += 1
        # A tombstone written in the same transaction licenses its own conversation only.
        for role, tenant in ((ERASER, None), (OWNER, a)):
            for table in GUARDED_TABLES:
                with pytest.raises(asyncpg.FeatureNotSupportedError):
                    await _raw(
                        rls,
                        role,
                        tenant,
                        "SELECT * FROM episodic_erase_conversation(p_conversation_id => "
                        f"'{convs[3]}', p_erasure_id => gen_random_uuid(), p_reason => 'r')",
                        delete.format(table=table, conv=target),
                    )
                refused_sql += 1
        assert await _counts(rls) == before, "a refused DELETE changed a table"

        # The eraser (by id alone, and scoped) and the owner (scoped) erase.
        erased: dict[UUID, tuple[str, Erasure]] = {}
        for (label, store, login), conv in zip(
            (
                ("eraser, no tenant", eraser, ERASER),
                ("eraser, scoped", eraser.for_tenant(a), ERASER),
                ("owner, scoped", owner.for_tenant(a), OWNER),
            ),
            convs[1:],
            strict=True,
        ):
            rows = await _rows_left(rls, [conv])
            tombstone = await store.erase_conversation(conv, reason=f"{label} erases")
            assert tombstone.erased_by == login, (label, tombstone)
            assert tombstone.tenant_id == a
            assert (tombstone.events, tombstone.compaction_attempts) == (
                rows["episodic_events"],
                rows["episodic_compaction_attempts"],
            ), label
            erased[conv] = (label, tombstone)
        assert set((await _rows_left(rls, list(erased))).values()) == {0}
        assert set((await _tombstones(rls, list(erased))).values()) == {1}
        # What was not erased is as it was.
        for conv, tenant in ((target, a), (kept, b)):
            assert all(n > 0 for n in (await _rows_left(rls, [conv])).values()), conv
            events = await _all_events(app.for_tenant(tenant), conv)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
        # And the eraser takes a whole tenant: its conversations, then its shared state.
        whole = await eraser.erase_tenant(b, reason="the eraser erases tenant globex")
        assert (whole.conversation_id, whole.conversations, whole.shared_states) == (None, 1, 1)
        assert set((await _rows_left(rls, [kept])).values()) == {0}
        assert (await _tombstones(rls, [kept]))[kept] == 1
        print(
            f"\nT15 roles: {denied} erasures refused (ErasureDeniedError), {not_found} found "
            f"nothing (NotFoundError), {refused_sql} raw DELETEs refused (0A000/42501), "
            f"checksums unchanged; {len(erased)} erased (eraser x2, owner x1) and tenant {b} "
            "by the eraser: 0 rows left, 1 tombstone each"
        )
    finally:
        for store in stores.values():
            await store.close()


async def test_t15_sqlite_has_no_roles_so_any_store_erases(sqlite_url: str) -> None:
    """SQLite has no database roles: there is no eraser to require, and any store, scoped or
    not, erases (the tombstone says ``erased_by="sqlite"``). Keep an SQLite file where only
    trusted code can open it."""
    store = await EpisodicStore.open(sqlite_url, settings=settings())
    try:
        scoped = store.for_tenant("acme")
        convs = [await scoped.create_conversation() for _ in range(2)]
        for conv in convs:
            await scoped.append(conv, _round("hello", tool=True))
        for erasing, conv in zip((store, scoped), convs, strict=True):
            tombstone = await erasing.erase_conversation(conv, reason="no roles on SQLite")
            assert tombstone.erased_by == "sqlite"
            assert tombstone.events == 4
            with pytest.raises(NotFoundError):
                await scoped.read_events(conv)
    finally:
        await store.close()


class GatedSummarizer:
    """Says when it is called, then answers only once released: the worker holds its lease
    for as long as the test likes."""

    name = "gated"

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        self.entered.set()
        await self.release.wait()
        return SummaryResult(text=f"summary of {request.source_messages} messages")


async def test_t15_a_worker_holding_the_lease_of_an_erased_conversation_writes_nothing(
    rls: RlsDatabase,
) -> None:
    """The race the battery hits by chance, driven with a barrier: the worker login has
    claimed the conversation and is waiting on its summarizer when the eraser login erases
    it; the attempt ends "gone", with no boundary and no attempt row."""
    app = await _open(rls, APP)
    worker_store = await _open(rls, WORKER)
    eraser = await _open(rls, ERASER)
    try:
        app.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
        (conv,) = await _seed(app, TENANTS[0], 1)
        summarizer = GatedSummarizer()
        worker = CompactionWorker(
            worker_store, summarizer, options=CompactionOptions(), worker_id="t15-gated"
        )
        attempt = asyncio.create_task(worker.run_once())
        await asyncio.wait_for(summarizer.entered.wait(), timeout=10)
        head = await app.for_tenant(TENANTS[0]).get_conversation(conv)
        assert head.lease_owner == "t15-gated"
        tombstone = await eraser.erase_conversation(conv, reason="erased mid-attempt")
        summarizer.release.set()
        results = await asyncio.wait_for(attempt, timeout=10)
        assert [r.outcome for r in results] == ["gone"]
        assert tombstone.compaction_attempts == 0
        assert set((await _rows_left(rls, [conv])).values()) == {0}
        assert (await _tombstones(rls, [conv]))[conv] == 1
        print("\nT15 lease: a worker mid-attempt on an erased conversation: gone, 0 rows")
    finally:
        await app.close()
        await worker_store.close()
        await eraser.close()


# ---- the battery ---------------------------------------------------------------------------


@dataclass
class Run:
    """What the tasks saw, for the checks afterwards."""

    #: erasures begun (added before the call): a NotFoundError is allowed for these only
    erasing: set[UUID] = field(default_factory=set)
    erased: dict[UUID, Erasure] = field(default_factory=dict)
    #: (conversation, seq, text) of every acknowledged event
    acknowledged: list[tuple[UUID, int, str]] = field(default_factory=list)
    appends: int = 0
    refused: Counter[UUID] = field(default_factory=Counter)
    transient: int = 0
    retries: int = 0
    #: per writer, per conversation: its last keyed batch
    last_keyed: list[dict[UUID, tuple[str, list[Message]]]] = field(default_factory=list)
    refused_live: list[str] = field(default_factory=list)
    resurrected: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    untyped: list[str] = field(default_factory=list)
    erased_twice: int = 0


async def _writer(
    index: int,
    scoped: dict[str, EpisodicStore],
    pool: list[tuple[UUID, str]],
    rng: random.Random,
    run: Run,
    stop: asyncio.Event,
) -> None:
    keyed = run.last_keyed[index]
    number = 0
    while not stop.is_set():
        number += 1
        conv, tenant = rng.choice(pool)
        tag = f"w{index}.{number}"
        key = f"w{index}-{number}" if rng.random() < 0.5 else None
        batch = _round(tag, tool=rng.random() < 0.5)
        if key is not None:
            keyed[conv] = (key, batch)
        refused_once = False
        for attempt in range(2):
            try:
                stored = await scoped[tenant].append(conv, batch, idempotency_key=key)
            except NotFoundError:
                run.refused[conv] += 1
                refused_once = True
                if conv not in run.erasing:
                    run.refused_live.append(f"{tag}: NotFoundError for live {conv}")
            except TransientDatabaseError:
                run.transient += 1
            except EpisodicError as exc:
                run.unexpected.append(f"{tag}: {type(exc).__name__}: {exc}")
                break
            except Exception as exc:
                run.untyped.append(f"{tag}: {type(exc).__name__}: {exc}")
                break
            else:
                run.appends += 1
                if refused_once:
                    run.resurrected.append(f"{tag}: retry of {key} succeeded on erased {conv}")
                run.acknowledged += [(conv, e.seq, e.message.text) for e in stored]
                break
            if key is None or attempt:
                break
            run.retries += 1
        await asyncio.sleep(0)


async def _eraser(
    eraser: EpisodicStore,
    victims: list[tuple[UUID, str]],
    rng: random.Random,
    run: Run,
) -> None:
    for conv, tenant in victims:
        await asyncio.sleep(rng.uniform(0, ERASER_PAUSE))
        store = eraser if rng.random() < 0.5 else eraser.for_tenant(tenant)
        run.erasing.add(conv)
        tombstone = await store.erase_conversation(conv, reason=f"t15 erases {conv}")
        assert tombstone.conversation_id == conv
        assert tombstone.tenant_id == tenant
        assert tombstone.erased_by == ERASER
        run.erased[conv] = tombstone
        if rng.random() < 0.2:  # erasing again returns the first tombstone, writes nothing
            again = rng.choice(list(run.erased))
            store = eraser if rng.random() < 0.5 else eraser.for_tenant(run.erased[again].tenant_id)
            assert await store.erase_conversation(again, reason="again") == run.erased[again]
            run.erased_twice += 1


@pytest.mark.parametrize("seed", seeds(1, 3))
async def test_t15_erasure_racing_writers_and_the_worker(rls: RlsDatabase, seed: int) -> None:
    rng = seeded(seed)
    app = await _open(rls, APP, pool_max_size=WRITERS + 2)
    worker_store = await _open(rls, WORKER)
    eraser = await _open(rls, ERASER)
    errors = LoggedExceptions()
    logging.getLogger("episodic").addHandler(errors)
    try:
        app.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
        scoped = {tenant: app.for_tenant(tenant) for tenant in TENANTS}
        pool: list[tuple[UUID, str]] = []
        for number in range(CONVERSATIONS):
            tenant = TENANTS[number % len(TENANTS)]
            conv = await scoped[tenant].create_conversation(metadata={"n": number})
            await scoped[tenant].append(conv, _round(f"seed.{number}", tool=True))
            pool.append((conv, tenant))
        victims = rng.sample(pool, ERASED)
        run = Run(last_keyed=[{} for _ in range(WRITERS)])
        metrics = WorkerMetrics()
        summarizer = FakeSummarizer(pause=0.02, seed=seed)
        worker = CompactionWorker(
            worker_store,
            summarizer,
            concurrency=4,
            options=CompactionOptions(),
            lease_seconds=30,
            poll_interval=0.05,
            shutdown_grace=10,
            worker_id="t15-worker",
            metrics=metrics,
        )
        stop = asyncio.Event()
        worker_task = asyncio.create_task(worker.run())
        writers = [
            asyncio.create_task(
                _writer(index, scoped, pool, random.Random(seed * 1_000 + index), run, stop)
            )
            for index in range(WRITERS)
        ]
        try:
            await _eraser(eraser, victims, rng, run)
            await asyncio.sleep(TAIL)
        finally:
            stop.set()
            worker.stop()
            escaped = await asyncio.gather(*writers, worker_task, return_exceptions=True)
        run.untyped += [f"escaped: {exc!r}" for exc in escaped if exc is not None]
        run.untyped += [
            f"worker logged {type(exc).__name__}: {exc}"
            for exc in errors.exceptions
            if not isinstance(exc, EpisodicError)
        ]
        run.unexpected += [
            f"worker logged {type(exc).__name__}: {exc}"
            for exc in errors.exceptions
            if isinstance(exc, EpisodicError)
        ]
        outcomes = Counter(
            {
                sample.labels["outcome"]: int(sample.value)
                for family in metrics.registry.collect()
                if family.name == "episodic_compaction_attempts"
                for sample in family.samples
                if sample.name.endswith("_total")
            }
        )
        context = f"seed {seed}"

        # Erased: nothing left anywhere, one tombstone each.
        erased = list(run.erased)
        assert set(erased) == {conv for conv, _ in victims}, context
        assert set((await _rows_left(rls, erased)).values()) == {0}, context
        assert set((await _tombstones(rls, erased)).values()) == {1}, context
        # Typed errors only, and the right ones.
        assert run.untyped == [], (context, run.untyped)
        assert run.unexpected == [], (context, run.unexpected)
        assert run.refused_live == [], (context, run.refused_live)
        assert run.resurrected == [], (context, run.resurrected)
        assert set(run.refused) <= set(run.erased), context
        assert set(outcomes) <= WORKER_OUTCOMES, (context, outcomes, errors.messages)
        # An acknowledged append to an erased conversation landed before the erasure.
        before_erasure = [(conv, seq) for conv, seq, _ in run.acknowledged if conv in run.erased]
        late = [(conv, seq) for conv, seq in before_erasure if seq > run.erased[conv].events]
        assert late == [], (context, late)

        # The others are intact: gapless, the head is the fold of the log, nothing lost.
        live = [(conv, tenant) for conv, tenant in pool if conv not in run.erased]
        logs: dict[UUID, dict[int, StoredEvent]] = {}
        boundaries = 0
        for conv, tenant in live:
            head = await scoped[tenant].get_conversation(conv)
            events = await _all_events(scoped[tenant], conv)
            assert [e.seq for e in events] == list(range(1, head.last_seq + 1)), (context, conv)
            assert rebuild_head(events) == counters_of(head), (context, conv)
            logs[conv] = {e.seq: e for e in events}
            boundaries += sum(e.kind == "boundary" for e in events)
        missing = []
        live_acknowledged = 0
        for conv, seq, text in run.acknowledged:
            if conv in logs:
                live_acknowledged += 1
                event = logs[conv].get(seq)
                if not isinstance(event, MessageEvent) or event.message.text != text:
                    missing.append((conv, seq, text))
        assert missing == [], (context, missing[:10])

        # Nothing comes back: not a keyed retry, not a create of the same id.
        retried = 0
        for keyed in run.last_keyed:
            for conv, (key, batch) in keyed.items():
                if conv in run.erased:
                    with pytest.raises(NotFoundError):
                        await scoped[run.erased[conv].tenant_id].append(
                            conv, batch, idempotency_key=key
                        )
                    retried += 1
        for conv in erased:
            with pytest.raises(ErasedConversationError):
                await scoped[run.erased[conv].tenant_id].create_conversation(conversation_id=conv)
            # what a search found in it goes with it
            with pytest.raises(NotFoundError):
                await scoped[run.erased[conv].tenant_id].search(conv, "question answer result")
        assert set((await _rows_left(rls, erased)).values()) == {0}, context
        assert set((await _tombstones(rls, erased)).values()) == {1}, context
        assert run.appends > 0, context
        assert outcomes["succeeded"] > 0, (context, outcomes)

        refused = sum(run.refused.values())
        print(
            f"\nT15 seed {seed}: {run.appends} appends acknowledged "
            f"({live_acknowledged} events in {len(live)} live conversations, all present; "
            f"{len(before_erasure)} in erased ones, all within their tombstone's count), "
            f"{refused} refused as not found (all erased), {run.retries} keyed retries of "
            "those (all refused too), "
            f"{run.transient} transient; {len(run.erased)} erasures (+{run.erased_twice} "
            f"repeated: same tombstone), 0 rows left, 1 tombstone each; worker "
            f"{dict(sorted(outcomes.items()))}, {boundaries} boundaries in live "
            f"conversations; {retried} keyed retries and {len(erased)} re-creates after the "
            f"run refused; untyped errors = {len(run.untyped)}"
        )
    finally:
        logging.getLogger("episodic").removeHandler(errors)
        await app.close()
        await worker_store.close()
        await eraser.close()
