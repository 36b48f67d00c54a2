"""T11 tenant isolation and T12 append-only enforcement, as PostgreSQL enforces them.

The database is owned and migrated by an ordinary role (``episodic_test_owner``), so FORCE
row-level security applies to it too; applications log in as members of ``episodic_app`` and
``episodic_worker`` (tests/reliability/rls.py).

T11 pass criteria: for 2 tenants x 3 conversations, every operation (append, load_context,
search, read_events, list, enqueue, worker processing) by every identity (tenant A, tenant B, no
tenant, the worker under the wrong tenant, the owner) reaches only its own tenant's rows:
cross-tenant reads give 0 rows (NotFoundError), cross-tenant writes are refused by the
database (SQLSTATE 42501, TenantDeniedError) or find nothing, and nothing changes. A
one-connection pool alternating tenants 1,000 times (20,000 nightly) shows 0 cross-tenant
rows and never leaves a tenant set on the connection. The catalog audit holds.

T12 pass criteria: UPDATE, DELETE and TRUNCATE on events and attempts as app, worker and
owner are all refused (runtime roles 42501, owner 0A000 from the trigger), with table
checksums unchanged, no rules on these tables and a BEFORE TRUNCATE trigger on each.

Run: EPISODIC_TEST_DATABASE_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/postgres \
     .venv/bin/pytest tests/reliability/test_t11_t12_tenants.py -q -s
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import pytest

from episodic import (
    BoundaryRequest,
    EpisodicStore,
    Message,
    NotFoundError,
    StateChange,
    TenantDeniedError,
    ToolCall,
)
from episodic.compaction import CompactionRequest
from episodic.policy import EpisodicCompactionConfig
from episodic.summarizers import SummaryResult
from episodic.worker import CompactionOptions, CompactionWorker
from episodic.worker.job import compact_claimed
from tests.reliability.rls import APP, OWNER, WORKER, RlsDatabase, rls_database, settings
from tests.reliability.sizes import size
from tests.support import FILE_LISTING

TENANTS = ("acme", "globex")
TENANT_TABLES = (
    "episodic_conversations",
    "episodic_events",
    "episodic_compaction_attempts",
    "episodic_shared_state",
    "episodic_erasures",
)
APPEND_ONLY = ("episodic_events", "episodic_compaction_attempts")
RUNTIME_GROUPS = ("episodic_app", "episodic_worker")


@pytest.fixture
async def rls(postgres_server: str, postgres_template: str) -> AsyncIterator[RlsDatabase]:
    # postgres_template: its migration, as a superuser, created the runtime group roles.
    async with rls_database(postgres_server) as database:
        yield database


class FakeSummarizer:
    name = "fake"

    async def summarize(self, request: CompactionRequest) -> SummaryResult:
        return SummaryResult(text=f"summary of {request.source_messages} messages")


async def _open(database: RlsDatabase, role: str, **overrides: object) -> EpisodicStore:
    return await EpisodicStore.open(database.url(role), settings=settings(**overrides))


async def _seed(app: EpisodicStore) -> dict[str, list[UUID]]:
    """3 conversations per tenant, each with a tool call pair and a due mark."""
    app.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=2)
    owned: dict[str, list[UUID]] = {}
    for tenant in TENANTS:
        scoped = app.for_tenant(tenant)
        owned[tenant] = []
        for index in range(3):
            conv = await scoped.create_conversation(
                metadata={"tenant": tenant},
                state=StateChange(shared={f"scope{index}": {"secret": tenant}}),
            )
            for turn in range(2):
                await scoped.append(
                    conv,
                    [
                        Message.user(f"{tenant} secret {index}.{turn}"),
                        Message.assistant(None, tool_calls=[ToolCall(id=f"c{turn}", name="f")]),
                        Message.tool_result(
                            f"c{turn}", f"{tenant} result:\n{FILE_LISTING}", name="f"
                        ),
                        Message.assistant(f"{tenant} answer"),
                    ],
                )
            owned[tenant].append(conv)
    return owned


async def _counts(database: RlsDatabase) -> dict[str, tuple[int, str]]:
    """Rows and an md5 of every tenant table, read by a superuser (RLS does not apply)."""
    connection = await asyncpg.connect(database.admin_dsn())
    try:
        out = {}
        for table in TENANT_TABLES:
            row = await connection.fetchrow(
                f"SELECT count(*) AS n, md5(coalesce(string_agg(t::text, '|' ORDER BY t::text),"
                f" '')) AS digest FROM {table} t"
            )
            out[table] = (row["n"], row["digest"])
        return out
    finally:
        await connection.close()


async def _raw(database: RlsDatabase, role: str, tenant: str | None, sql: str) -> object:
    """One statement as ``role`` in a transaction with ``tenant`` set (or none)."""
    connection = await asyncpg.connect(database.dsn(role))
    try:
        async with connection.transaction():
            if tenant is not None:
                # as the store sets it: on Citus a plain set_config stays on the coordinator
                await connection.execute("SELECT episodic_set_tenant($1)", tenant)
            return await connection.fetch(sql)
    finally:
        await connection.close()


async def test_t11_every_identity_reaches_only_its_own_tenant(rls: RlsDatabase) -> None:
    app = await _open(rls, APP)
    worker_store = await _open(rls, WORKER)
    owner = await _open(rls, OWNER)
    try:
        owned = await _seed(app)
        before = await _counts(rls)
        cells = 0
        a, b = TENANTS
        identities: dict[str, EpisodicStore] = {
            "tenant B": app.for_tenant(b),
            "no tenant": app,
            "worker, wrong tenant": worker_store.for_tenant(b),
            "owner": owner,
        }
        for label, store in identities.items():
            for conv in owned[a]:
                for operation in (
                    lambda s, c: s.load_context(c),
                    lambda s, c: s.read_events(c),
                    lambda s, c: s.search(c, f"{a} secret result answer"),
                    lambda s, c: s.get_conversation(c),
                    lambda s, c: s.append(c, [Message.user("intruder")]),
                    lambda s, c: s.mark_run_completed(c),
                    lambda s, c: s.claim_conversation(c, "intruder", lease_seconds=30),
                    lambda s, c: s.write_boundary(
                        c,
                        BoundaryRequest(
                            summary="stolen",
                            covers_through_seq=4,
                            reason="manual_recovery",
                            expected_boundary_seq=None,
                        ),
                    ),
                ):
                    with pytest.raises(NotFoundError):
                        await operation(store, conv)
                    cells += 1
            listed = {c.conversation_id for c in await store.list_conversations(limit=1_000)}
            assert not listed & set(owned[a]), f"{label} listed tenant {a}'s conversations"
            cells += 1
        # Each tenant lists exactly its own, and finds its own words in each of its own.
        for tenant in TENANTS:
            listed = {c.conversation_id for c in await app.for_tenant(tenant).list_conversations()}
            assert listed == set(owned[tenant])
            cells += 1
            for conv in owned[tenant]:
                found = await app.for_tenant(tenant).search(conv, f"{tenant} secret")
                assert [hit.seq for hit in found][:2] == [6, 2], found  # both words first
                cells += 1
        # A scoped store cannot create for, or turn into, another tenant.
        with pytest.raises(TenantDeniedError):
            await app.for_tenant(b).create_conversation(tenant_id=a)
        with pytest.raises(TenantDeniedError):
            app.for_tenant(b).for_tenant(a)
        assert await _counts(rls) == before, "a refused cross-tenant operation changed rows"

        # "list": what each identity sees of each table, straight from SQL.
        for table in TENANT_TABLES:
            for role, tenant, expected_tenants in (
                (APP, a, {a}),
                (APP, b, {b}),
                (APP, None, set()),
                (OWNER, None, set()),
                (OWNER, a, {a}),
                (WORKER, b, {b}),
            ):
                if role == WORKER and table == "episodic_shared_state":
                    continue  # the worker is granted nothing on shared state
                rows = await _raw(rls, role, tenant, f"SELECT DISTINCT tenant_id FROM {table}")
                seen = {r["tenant_id"] for r in rows}  # type: ignore[attr-defined]
                if role == WORKER and table == "episodic_conversations":
                    # The worker's queue: every head (never a message) is visible to it.
                    expected_tenants = set(TENANTS)
                if role == WORKER and table == "episodic_compaction_attempts":
                    expected_tenants = seen & set(TENANTS)  # the ledger is the worker's own
                assert seen <= expected_tenants, (role, tenant, table, seen)
                cells += 1

        # Writes across tenants are refused by the database itself: 42501.
        conv_a = owned[a][0]
        for role in (APP, WORKER, OWNER):
            for sql in (
                "INSERT INTO episodic_events (conversation_id, seq, tenant_id, kind, created_at, "
                f"token_estimate, payload) VALUES ('{conv_a}', 1000, '{a}', 'message', now(), 1, "
                "'{}')",
                "INSERT INTO episodic_conversations (conversation_id, tenant_id, created_at, "
                f"metadata, open_tool_calls) VALUES (gen_random_uuid(), '{a}', now(), '{{}}', "
                "'{}')",
            ):
                if role == WORKER and "episodic_conversations" in sql:
                    continue  # the worker may not insert heads at all (also 42501, below)
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await _raw(rls, role, b, sql)
                cells += 1
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await _raw(
                rls,
                WORKER,
                a,
                "INSERT INTO episodic_conversations (conversation_id, "
                f"tenant_id, created_at, metadata, open_tool_calls) VALUES "
                f"(gen_random_uuid(), '{a}', now(), '{{}}', '{{}}')",
            )
        # An UPDATE of another tenant's head finds nothing to update.
        updated = await _raw(
            rls,
            APP,
            b,
            f"UPDATE episodic_conversations SET last_error = 'x' WHERE conversation_id = "
            f"'{conv_a}' RETURNING 1",
        )
        assert updated == []
        assert await _counts(rls) == before, "a refused cross-tenant write changed rows"
        print(f"\nT11: {cells} cross-tenant cells, 0 rows crossed, 0 rows changed")
    finally:
        await app.close()
        await worker_store.close()
        await owner.close()


async def test_t11_the_worker_compacts_every_tenant_and_only_as_that_tenant(
    rls: RlsDatabase,
) -> None:
    app = await _open(rls, APP)
    worker_store = await _open(rls, WORKER)
    try:
        owned = await _seed(app)
        worker = CompactionWorker(
            worker_store,
            FakeSummarizer(),  # type: ignore[arg-type]
            options=CompactionOptions(),
            worker_id="rls-worker",
        )
        results = await worker.run_once()
        assert sorted(r.outcome for r in results) == ["succeeded"] * 6
        for tenant, convs in owned.items():
            for conv in convs:
                ctx = await app.for_tenant(tenant).load_context(conv)
                assert ctx.boundary is not None
                other = TENANTS[1 - TENANTS.index(tenant)]
                assert other not in " ".join(str(m.content) for m in ctx.messages)
        status = await worker_store.compaction_status()
        assert status.due == 0
        assert len(status.recent_attempts) == 6

        # A worker acting for the wrong tenant: the claim is refused by the store, and the
        # same write sent straight to the database is refused by row-level security.
        a, b = TENANTS
        conv = owned[a][0]
        await app.for_tenant(a).append(conv, [Message.user("more")])
        [claim] = [
            c
            for c in [await worker_store.claim_conversation(conv, "w", lease_seconds=30)]
            if c is not None
        ]
        with pytest.raises(TenantDeniedError):
            await compact_claimed(
                worker_store.for_tenant(b),
                FakeSummarizer(),  # type: ignore[arg-type]
                claim,
                worker="w",
                options=CompactionOptions(),
            )
        before = await _counts(rls)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await _raw(
                rls,
                WORKER,
                b,
                "INSERT INTO episodic_compaction_attempts (conversation_id, attempt_id, "
                "tenant_id, worker, reason, outcome, started_at, finished_at) VALUES "
                f"('{conv}', gen_random_uuid(), '{a}', 'w', 'r', 'succeeded', now(), now())",
            )
        assert await _counts(rls) == before
    finally:
        await app.close()
        await worker_store.close()


async def test_t11_a_pooled_connection_alternating_tenants_never_crosses(
    rls: RlsDatabase,
) -> None:
    switches = size(1_000, 20_000)
    app = await _open(rls, APP, pool_min_size=1, pool_max_size=1)
    try:
        convs = {}
        for tenant in TENANTS:
            convs[tenant] = await app.for_tenant(tenant).create_conversation()
        crossed = 0
        for step in range(switches):
            tenant = TENANTS[step % 2]
            other = TENANTS[1 - step % 2]
            scoped = app.for_tenant(tenant)
            if step % 10 < 2:
                await scoped.append(convs[tenant], [Message.user(f"{tenant} {step}")])
            ctx = await scoped.load_context(convs[tenant])
            crossed += sum(other in str(m.content) for m in ctx.messages)
            try:
                await scoped.load_context(convs[other])
                crossed += 1
            except NotFoundError:
                pass
            if step % 100 == 0:
                # The one pooled connection carries no tenant between transactions.
                pool = app._backend._pool  # type: ignore[attr-defined]
                leftover = await pool.fetchval("SELECT current_setting('episodic.tenant_id', true)")
                assert not leftover, f"tenant {leftover!r} left on a pooled connection"
                with pytest.raises(NotFoundError):
                    await app.load_context(convs[tenant])
        assert crossed == 0
        print(f"\nT11: {switches} tenant switches on one pooled connection, {crossed} crossed")
    finally:
        await app.close()


async def test_t11_catalog_audit(rls: RlsDatabase) -> None:
    connection = await asyncpg.connect(rls.admin_dsn())
    try:
        runtime = [*RUNTIME_GROUPS, APP, WORKER]
        roles = await connection.fetch(
            "SELECT rolname, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = ANY($1)",
            runtime,
        )
        assert len(roles) == len(runtime)
        assert all(not r["rolsuper"] and not r["rolbypassrls"] for r in roles), roles
        owned = await connection.fetchval(
            "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
            "WHERE r.rolname = ANY($1)",
            runtime,
        )
        assert owned == 0
        all_tenants_members = await connection.fetchval(
            "SELECT count(*) FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid "
            "JOIN pg_roles u ON u.oid = m.member "
            "WHERE g.rolname = 'episodic_all_tenants' AND u.rolname = ANY($1)",
            runtime,
        )
        assert all_tenants_members == 0
        tables = await connection.fetch(
            "SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class "
            "WHERE relname = ANY($1) AND relkind = 'r'",
            list(TENANT_TABLES),
        )
        assert len(tables) == len(TENANT_TABLES)
        assert all(t["relrowsecurity"] and t["relforcerowsecurity"] for t in tables), tables
        views = await connection.fetchval(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('v', 'm') AND n.nspname = 'public' "
            "AND NOT coalesce('security_invoker=true' = ANY(c.reloptions), false) "
            # an extension's own views (Citus puts citus_tables, citus_schemas in public)
            "AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass "
            "AND d.objid = c.oid AND d.deptype = 'e')"
        )
        assert views == 0
        definers = await connection.fetch(
            "SELECT proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND p.prosecdef"
        )
        assert definers == []
        uniques = await connection.fetch(
            "SELECT c.relname AS index, t.relname AS table_name, "
            "array_agg(a.attname::text) AS columns FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
            "JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indisunique AND t.relname = ANY($1) GROUP BY c.relname, t.relname",
            list(TENANT_TABLES),
        )
        assert uniques
        for index in uniques:
            assert {"tenant_id", "conversation_id"} & set(index["columns"]), index
        print(
            f"\nT11 audit: {len(roles)} runtime roles (no superuser, no BYPASSRLS, own nothing),"
            f" {len(tables)} tables with FORCE RLS, 0 views, 0 SECURITY DEFINER, "
            f"{len(uniques)} unique indexes all keyed by conversation or tenant"
        )
    finally:
        await connection.close()


async def test_t12_updates_deletes_and_truncates_are_refused_for_every_role(
    rls: RlsDatabase,
) -> None:
    app = await _open(rls, APP)
    worker_store = await _open(rls, WORKER)
    try:
        owned = await _seed(app)
        await CompactionWorker(
            worker_store,
            FakeSummarizer(),  # type: ignore[arg-type]
            options=CompactionOptions(),
            worker_id="w",
        ).run_once()
    finally:
        await app.close()
        await worker_store.close()
    before = await _counts(rls)
    assert before["episodic_compaction_attempts"][0] == 6
    tenant = TENANTS[0]
    conv = owned[tenant][0]
    refused = 0
    for role in (APP, WORKER, OWNER):
        expected = (
            asyncpg.FeatureNotSupportedError
            if role == OWNER
            else asyncpg.InsufficientPrivilegeError
        )
        for table in APPEND_ONLY:
            for sql in (
                f"UPDATE {table} SET tenant_id = tenant_id WHERE conversation_id = '{conv}'",
                f"DELETE FROM {table} WHERE conversation_id = '{conv}'",
                f"TRUNCATE {table}",
            ):
                with pytest.raises(expected):
                    await _raw(rls, role, tenant, sql)
                refused += 1
    assert refused == 18
    assert await _counts(rls) == before, "a refused statement changed a table"
    connection = await asyncpg.connect(rls.admin_dsn())
    try:
        rules = await connection.fetchval(
            "SELECT count(*) FROM pg_rules WHERE tablename = ANY($1)", list(APPEND_ONLY)
        )
        truncate_triggers = await connection.fetchval(
            "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE c.relname = ANY($1) AND (t.tgtype & 32) <> 0 AND (t.tgtype & 2) <> 0",
            list(APPEND_ONLY),
        )
    finally:
        await connection.close()
    assert rules == 0
    assert truncate_triggers == len(APPEND_ONLY)
    print(f"\nT12: {refused}/18 UPDATE/DELETE/TRUNCATE refused, checksums unchanged, 0 rules")
