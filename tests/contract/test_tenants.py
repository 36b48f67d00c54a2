"""``store.for_tenant()``: a store scoped to one tenant, on both backends.

On PostgreSQL the database enforces the scope as well (tests/reliability/test_t11_t12_tenants.py
runs as the runtime roles); here the connection is a superuser's, which row-level security
does not restrict, so what is tested is the store's own scoping, the same on SQLite.
"""

from __future__ import annotations

from uuid import UUID

import pytest

from episodic import (
    BoundaryRequest,
    EpisodicStore,
    Message,
    NotFoundError,
    TenantDeniedError,
    ValidationError,
)
from episodic.policy import EpisodicCompactionConfig
from episodic.worker import CompactionOptions, CompactionWorker
from tests.contract.test_worker import ScriptedSummarizer
from tests.support import FILE_LISTING, snapshot


async def _conversation(store: EpisodicStore, tenant: str) -> UUID:
    scoped = store.for_tenant(tenant)
    conv = await scoped.create_conversation()
    hello = [Message.user(f"{tenant} says hello"), Message.assistant(f"hi:\n{FILE_LISTING}")]
    await scoped.append(conv, hello)
    return conv


async def test_a_scoped_store_creates_in_its_tenant_and_reads_its_own(store: EpisodicStore) -> None:
    acme = store.for_tenant("acme")
    assert acme.tenant_id == "acme"
    assert store.tenant_id is None
    conv = await _conversation(store, "acme")
    assert (await acme.get_conversation(conv)).tenant_id == "acme"
    assert next(m.content for m in (await acme.load_context(conv)).messages) == "acme says hello"
    assert len(await acme.read_events(conv)) == 2
    await acme.mark_run_completed(conv)
    await acme.close()  # shares the parent's connections: closing it closes nothing
    assert (await store.get_conversation(conv)).last_seq == 3


async def test_another_tenants_conversation_is_not_found_and_unchanged(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await _conversation(store, "acme")
    globex = store.for_tenant("globex")
    before = await snapshot(database_url)
    for attempt in (
        globex.get_conversation(conv),
        globex.load_context(conv),
        globex.read_events(conv),
        globex.append(conv, [Message.user("intruder")]),
        globex.mark_run_completed(conv),
        globex.claim_conversation(conv, "w", lease_seconds=30),
        globex.write_boundary(
            conv,
            BoundaryRequest(
                summary="s", covers_through_seq=2, reason="r", expected_boundary_seq=None
            ),
        ),
    ):
        with pytest.raises(NotFoundError):
            await attempt
    assert await snapshot(database_url) == before


async def test_a_scoped_store_refuses_other_tenants_and_bad_names(store: EpisodicStore) -> None:
    acme = store.for_tenant("acme")
    with pytest.raises(TenantDeniedError, match="scoped to tenant 'acme'"):
        await acme.create_conversation(tenant_id="globex")
    with pytest.raises(TenantDeniedError):
        acme.for_tenant("globex")
    assert acme.for_tenant("acme").tenant_id == "acme"
    for bad in ("", "x" * 300, "a\x00b", 7):
        with pytest.raises(ValidationError):
            store.for_tenant(bad)  # type: ignore[arg-type]


async def test_a_scoped_worker_claims_only_its_tenant(store: EpisodicStore) -> None:
    store.trigger = EpisodicCompactionConfig(trigger_unfinished_turns=1)
    convs = {tenant: await _conversation(store, tenant) for tenant in ("acme", "globex")}
    acme = store.for_tenant("acme")
    worker = CompactionWorker(
        acme,
        ScriptedSummarizer(),  # type: ignore[arg-type]
        options=CompactionOptions(),
        worker_id="acme-worker",
    )
    [result] = await worker.run_once()
    assert result.outcome == "succeeded"
    assert (await store.get_conversation(convs["acme"])).boundary_seq is not None
    assert (await store.get_conversation(convs["globex"])).boundary_seq is None
    # The unscoped worker compacts the rest, each as its own tenant.
    [result] = await CompactionWorker(
        store,
        ScriptedSummarizer(),  # type: ignore[arg-type]
        options=CompactionOptions(),
        worker_id="all",
    ).run_once()
    assert result.outcome == "succeeded"
    assert (await store.get_conversation(convs["globex"])).boundary_seq is not None


async def test_list_conversations_pages_newest_first_within_the_tenant(
    store: EpisodicStore,
) -> None:
    acme = store.for_tenant("acme")
    made = [await acme.create_conversation() for _ in range(5)]
    other = await store.for_tenant("globex").create_conversation()
    first = await acme.list_conversations(limit=3)
    rest = await acme.list_conversations(limit=3, before=first[-1].conversation_id)
    listed = [c.conversation_id for c in first + rest]
    assert sorted(listed) == sorted(made)
    assert len(set(listed)) == 5
    times = [(c.created_at, c.conversation_id) for c in first + rest]
    assert times == sorted(times, reverse=True)
    assert other in [c.conversation_id for c in await store.list_conversations()]
    assert [c.conversation_id for c in await store.for_tenant("globex").list_conversations()] == [
        other
    ]
    with pytest.raises(ValidationError):
        await acme.list_conversations(limit=0)
