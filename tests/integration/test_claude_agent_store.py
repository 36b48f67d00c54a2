"""EpisodicSessionStore against the Claude Agent SDK's own conformance suite, on both
backends, then what the suite does not check: ``uuid`` dedupe under retries and concurrent
appends, concurrent folds of the session summary, deletion as erasure, tenants, bad input.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import uuid4

import pytest

from episodic import EpisodicStore, ValidationError
from episodic.display import describe_event, event_kind
from episodic.errors import ErasedConversationError
from tests.support import require_extra

claude_agent_sdk = require_extra("claude_agent_sdk", "claude-agent")
from claude_agent_sdk import SessionStore  # noqa: E402
from claude_agent_sdk.testing import run_session_store_conformance  # noqa: E402
from claude_agent_sdk.types import SessionKey  # noqa: E402

from episodic.integrations.claude_agent import (  # noqa: E402
    ENTRY_PROTOCOL,
    EpisodicSessionStore,
    key_conversation_id,
)

#: the contracts the SDK's suite runs when every optional method is implemented
SUITE_CONTRACTS = 14
KEY: SessionKey = {"project_key": "/work/app", "session_id": "0b6c5a8e-1f1e-4c8e-9c39-3d9c1b7a2f10"}


def _entry(uid: str | None, kind: str = "user", **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": kind, "timestamp": "2026-12-04T10:00:00.000Z", **fields}
    if uid is not None:
        entry["uuid"] = uid
    return entry


async def test_the_sdks_conformance_suite_passes(
    store: EpisodicStore, capsys: pytest.CaptureFixture[str]
) -> None:
    made = 0

    def fresh() -> EpisodicSessionStore:
        # The suite hard-codes its project keys and wants an empty store per contract: a
        # new tenant is one (the keys, the listings and the summaries are the tenant's).
        nonlocal made
        made += 1
        return EpisodicSessionStore(store.for_tenant(f"conformance-{uuid4().hex}"))

    assert SessionStore in type(fresh()).__mro__  # the SDK's protocol, subclassed
    made = 0
    await run_session_store_conformance(fresh)
    contracts = made - 1  # one store probes which optional methods exist
    with capsys.disabled():
        print(
            f"\nclaude-agent-sdk {claude_agent_sdk.__version__} SessionStore conformance on "
            f"{store.dialect}: {contracts} of {SUITE_CONTRACTS} contracts passed, 0 skipped"
        )
    assert contracts == SUITE_CONTRACTS


async def test_entries_come_back_deep_equal_whatever_they_hold(store: EpisodicStore) -> None:
    claude = EpisodicSessionStore(store)
    entries = [
        _entry(
            "u1",
            message={"role": "user", "content": "Fix the failing test in src/app.py"},
            cwd="/work/app",
            isSidechain=False,
        ),
        _entry(
            "a1",
            "assistant",
            parentUuid="u1",
            message={
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Running it."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"x": 1.5}},
                ],
                "usage": {"input_tokens": 12, "output_tokens": 3},
            },
        ),
        _entry(
            "t1",
            "user",
            message={
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 failed\u0000"},
                ],
            },
        ),
        {"type": "custom-title", "customTitle": "Fix it", "sessionId": KEY["session_id"]},
        _entry("p1", "progress", data={"nested": [None, True, {"deep": []}], "big": 2**53}),
    ]
    await claude.append(KEY, entries)
    assert await claude.load(KEY) == entries
    # the user and assistant lines are the conversation's messages: search finds them
    found = await store.search(key_conversation_id(KEY), "failing test")
    assert entries[0] in [hit.message.native.data for hit in found if hit.message.native]
    assert {hit.message.native.protocol for hit in found if hit.message.native} == {ENTRY_PROTOCOL}


async def test_a_retried_or_overlapping_batch_stores_each_uuid_once(store: EpisodicStore) -> None:
    claude = EpisodicSessionStore(store)
    first = [_entry("u1"), _entry("u2")]
    await claude.append(KEY, first)
    await claude.append(KEY, first)  # the SDK's retry of a batch that did commit
    # a retry that overlaps the stored batch and brings new entries, first entry stored
    await claude.append(KEY, [_entry("u2"), _entry("u3")])
    # an overlap further in, and the same uuid twice in one batch
    await claude.append(KEY, [_entry("u4"), _entry("u1"), _entry("u4"), _entry("u5")])
    loaded = await claude.load(KEY)
    assert loaded is not None
    assert [e.get("uuid") for e in loaded] == ["u1", "u2", "u3", "u4", "u5"]
    # an entry without a uuid has no key to dedupe by: appended as it comes, as the SDK asks
    tag = _entry(None, "tag", tag="x")
    await claude.append(KEY, [tag])
    await claude.append(KEY, [_entry("u5"), tag])
    assert [e.get("uuid") for e in await claude.load(KEY) or []][-2:] == [None, None]


async def test_concurrent_appends_lose_nothing_and_store_each_uuid_once(
    store: EpisodicStore,
) -> None:
    claude = EpisodicSessionStore(store)
    batches = [[_entry(f"w{w}-{n}") for n in range(5)] for w in range(6)]
    # every batch twice, at once: two processes mirroring, or a retry racing its original
    await asyncio.gather(*(claude.append(KEY, batch) for batch in batches + batches))
    loaded = await claude.load(KEY) or []
    assert sorted(e["uuid"] for e in loaded) == sorted(e["uuid"] for b in batches for e in b)
    # each batch stored whole and in order: its entries are contiguous
    order = [e["uuid"] for e in loaded]
    for batch in batches:
        at = order.index(batch[0]["uuid"])
        assert order[at : at + 5] == [e["uuid"] for e in batch]


async def test_concurrent_appends_fold_the_summary_over_every_batch(store: EpisodicStore) -> None:
    claude = EpisodicSessionStore(store)
    titles = [f"title {n}" for n in range(8)]
    await claude.append(KEY, [_entry("u0", message={"role": "user", "content": "first ask"})])
    await asyncio.gather(
        *(
            claude.append(KEY, [{"type": "custom-title", "customTitle": t, "uuid": t}])
            for t in titles
        )
    )
    loaded = await claude.load(KEY) or []
    last_title = [e["customTitle"] for e in loaded if e["type"] == "custom-title"][-1]
    (summary,) = await claude.list_session_summaries(KEY["project_key"])
    # the fold saw every batch in the order the log holds them (no fold lost to a race)
    assert summary["data"]["custom_title"] == last_title
    assert summary["data"]["first_prompt"] == "first ask"
    (listed,) = await claude.list_sessions(KEY["project_key"])
    assert summary["mtime"] == listed["mtime"]
    assert abs(listed["mtime"] - time.time() * 1000) < 60_000  # epoch milliseconds


async def test_delete_is_an_erasure_that_cascades_to_subpaths(store: EpisodicStore) -> None:
    claude = EpisodicSessionStore(store)
    sub: SessionKey = {**KEY, "subpath": "subagents/agent-1"}
    await claude.append(KEY, [_entry("m1")])
    await claude.append(sub, [_entry("s1")])
    assert await claude.list_subkeys(KEY) == ["subagents/agent-1"]
    await claude.delete(KEY)
    assert await claude.load(KEY) is None
    assert await claude.load(sub) is None
    assert await claude.list_sessions(KEY["project_key"]) == []
    # each left the erasure path's tombstone, and the search index holds nothing of them
    erased = await store.erase_conversation(key_conversation_id(KEY), reason="again")
    assert erased.reason == "claude-agent-sdk SessionStore.delete"  # the first tombstone
    # a late write from the mirror does not bring the deleted session back
    with pytest.raises(ErasedConversationError):
        await claude.append(KEY, [_entry("m2")])
    await claude.delete({"project_key": "nowhere", "session_id": "never"})  # nothing to do


async def test_claude_codes_compaction_lines_are_shown_as_boundaries(store: EpisodicStore) -> None:
    claude = EpisodicSessionStore(store)
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "content": "Conversation compacted",
        "uuid": "c1",
        "compactMetadata": {"trigger": "manual", "preTokens": 98_765, "postTokens": 4_321},
    }
    summary = _entry("s1", message={"role": "user", "content": "Summary: ..."})
    await claude.append(KEY, [_entry("u1"), boundary, {**summary, "isCompactSummary": True}])
    events = await store.read_events(key_conversation_id(KEY))
    shown = [(event_kind(e), describe_event(e)) for e in events if e.kind == "message"]
    # what `episodic show` prints for each line
    assert shown[1] == (
        "boundary",
        "Claude Code compaction boundary (manual, 98,765 -> 4,321 tokens)",
    )
    assert [kind for kind, _ in shown] == ["user", "boundary", "user"]
    assert await claude.load(KEY) == [_entry("u1"), boundary, {**summary, "isCompactSummary": True}]


async def test_a_tenant_sees_only_its_own_sessions(store: EpisodicStore) -> None:
    acme = EpisodicSessionStore(store.for_tenant("acme"))
    globex = EpisodicSessionStore(store.for_tenant("globex"))
    await acme.append(KEY, [_entry("a1")])
    assert await globex.load(KEY) is None
    assert await globex.list_sessions(KEY["project_key"]) == []
    await globex.append(KEY, [_entry("a1")])  # the same uuid, another tenant's session
    assert await acme.load(KEY) == [_entry("a1")]
    assert await globex.load(KEY) == [_entry("a1")]


@pytest.mark.parametrize(
    ("key", "entries", "match"),
    [
        ({"project_key": "", "session_id": "s"}, [_entry("u")], "project_key"),
        ({"project_key": "p"}, [_entry("u")], "session_id"),
        ({"project_key": "p", "session_id": "s", "subpath": ""}, [_entry("u")], "subpath"),
        ({"project_key": "p", "session_id": "s"}, [{"uuid": "u"}], "'type'"),
        ({"project_key": "p", "session_id": "s"}, "not a list", "list"),
    ],
)
async def test_bad_input_is_refused_with_a_typed_error_and_writes_nothing(
    store: EpisodicStore, key: Any, entries: Any, match: str
) -> None:
    claude = EpisodicSessionStore(store)
    with pytest.raises(ValidationError, match=match):
        await claude.append(key, entries)
    assert await store.list_conversations() == []
