"""EpisodicSessionService against Google ADK's session contract, on PostgreSQL and SQLite.

The contract tests (the first part) are the behaviours adk-python's own suite states for
every ``BaseSessionService`` (tests/unittests/sessions, not in the PyPI package; see
../shared/research/adapters.md section 2.3), written again here, and run against ADK's own
``InMemorySessionService`` too, as the control: a test that ADK's service fails would be a
test of something else. The second part ports what ADK pins to its database service (stale
sessions, deleted sessions, tied timestamps, re-delivered events) and what episodic adds
(nothing written on a refusal, the tombstone, the log keeping every event).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from episodic import EpisodicStore, NotFoundError, ValidationError
from tests.conftest import isolated_settings
from tests.support import require_extra

require_extra("google.adk", "google-adk")
from google.adk.errors import StaleSessionError  # noqa: E402
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.adk.sessions.base_session_service import (  # noqa: E402
    BaseSessionService,
    GetSessionConfig,
)
from google.adk.sessions.in_memory_session_service import InMemorySessionService  # noqa: E402
from google.adk.tools.tool_confirmation import ToolConfirmation  # noqa: E402
from google.genai import types  # noqa: E402

from episodic.integrations.adk import (  # noqa: E402
    EpisodicSessionService,
    session_conversation_id,
)

SERVICES = ["in_memory", "postgresql", "sqlite"]
OURS = ["postgresql", "sqlite"]


@pytest.fixture
def service_url(request: pytest.FixtureRequest) -> str | None:
    """The database a service runs on (None: ADK's in-memory service)."""
    kind = request.param
    if kind == "in_memory":
        return None
    return str(request.getfixturevalue("postgres_url" if kind == "postgresql" else "sqlite_url"))


@pytest.fixture
async def service(service_url: str | None) -> AsyncIterator[BaseSessionService]:
    if service_url is None:
        yield InMemorySessionService()
        return
    store = await EpisodicStore.open(service_url, settings=isolated_settings())
    try:
        yield EpisodicSessionService(store)
    finally:
        await store.close()


contract = pytest.mark.parametrize("service_url", SERVICES, indirect=True)
ours = pytest.mark.parametrize("service_url", OURS, indirect=True)


def _event(
    *,
    text: str | None = None,
    author: str = "user",
    state: dict[str, Any] | None = None,
    timestamp: float | None = None,
    **fields: Any,
) -> Event:
    values: dict[str, Any] = {"invocation_id": "inv", "author": author, **fields}
    if text is not None:
        role = "user" if author == "user" else "model"
        values["content"] = types.Content(role=role, parts=[types.Part(text=text)])
    if state is not None:
        values["actions"] = EventActions(state_delta=state)
    if timestamp is not None:
        values["timestamp"] = timestamp
    return Event(**values)


# ---- ADK's contract -------------------------------------------------------------------------


@contract
async def test_get_empty_session(service: BaseSessionService) -> None:
    assert await service.get_session(app_name="app", user_id="u", session_id="nope") is None


@contract
async def test_create_get_session(service: BaseSessionService) -> None:
    state = {"key": "value"}
    session = await service.create_session(app_name="app", user_id="u", state=state)
    assert session.app_name == "app"
    assert session.user_id == "u"
    assert session.id
    assert session.state == state
    assert session.last_update_time <= time.time()
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got == session
    assert got.last_update_time == session.last_update_time
    await service.delete_session(app_name="app", user_id="u", session_id=session.id)
    assert await service.get_session(app_name="app", user_id="u", session_id=session.id) is None


@contract
async def test_create_and_list_sessions(service: BaseSessionService) -> None:
    ids = [f"session{i}" for i in range(5)]
    for i, sid in enumerate(ids):
        await service.create_session(
            app_name="app", user_id="u", session_id=sid, state={"key": f"value{i}"}
        )
    listed = (await service.list_sessions(app_name="app", user_id="u")).sessions
    assert sorted(s.id for s in listed) == ids
    for session in listed:
        assert session.state == {"key": f"value{ids.index(session.id)}"}


@contract
async def test_list_sessions_ordered_by_last_update_time(service: BaseSessionService) -> None:
    for sid in ("a", "b", "c"):
        await service.create_session(app_name="app", user_id="u", session_id=sid)
    await asyncio.sleep(0.01)
    a = await service.get_session(app_name="app", user_id="u", session_id="a")
    assert a is not None
    await service.append_event(a, _event(text="later"))
    listed = (await service.list_sessions(app_name="app", user_id="u")).sessions
    assert [s.id for s in listed] == ["b", "c", "a"]


@contract
async def test_list_sessions_all_users(service: BaseSessionService) -> None:
    await service.create_session(app_name="app", user_id="u1", session_id="s1", state={"k": 1})
    await service.create_session(app_name="app", user_id="u1", session_id="s2", state={"k": 2})
    await service.create_session(app_name="app", user_id="u2", session_id="s3", state={"k": 3})
    await service.create_session(app_name="other", user_id="u1", session_id="s4")
    mine = (await service.list_sessions(app_name="app", user_id="u1")).sessions
    assert sorted((s.id, s.state["k"]) for s in mine) == [("s1", 1), ("s2", 2)]
    every = (await service.list_sessions(app_name="app")).sessions
    assert sorted((s.user_id, s.id) for s in every) == [("u1", "s1"), ("u1", "s2"), ("u2", "s3")]


@contract
async def test_app_state_is_shared_by_all_users_of_app(service: BaseSessionService) -> None:
    first = await service.create_session(app_name="app", user_id="u1", state={"app:k": "v"})
    await service.append_event(first, _event(text="x", state={"app:k2": "v2"}))
    other = await service.create_session(app_name="app", user_id="u2")
    assert other.state == {"app:k": "v", "app:k2": "v2"}
    again = await service.get_session(app_name="app", user_id="u2", session_id=other.id)
    assert again is not None
    assert again.state == {"app:k": "v", "app:k2": "v2"}


@contract
async def test_user_state_is_shared_only_by_user_sessions(service: BaseSessionService) -> None:
    first = await service.create_session(app_name="app", user_id="u1", state={"user:k": "v"})
    await service.append_event(first, _event(text="x", state={"user:k2": "v2"}))
    same_user = await service.create_session(app_name="app", user_id="u1")
    assert same_user.state == {"user:k": "v", "user:k2": "v2"}
    other_user = await service.create_session(app_name="app", user_id="u2")
    assert other_user.state == {}


@contract
async def test_session_state_is_not_shared(service: BaseSessionService) -> None:
    first = await service.create_session(app_name="app", user_id="u", state={"k": "v"})
    await service.append_event(first, _event(text="x", state={"k2": "v2"}))
    second = await service.create_session(app_name="app", user_id="u")
    assert second.state == {}
    again = await service.get_session(app_name="app", user_id="u", session_id=first.id)
    assert again is not None
    assert again.state == {"k": "v", "k2": "v2"}


@contract
async def test_dict_valued_state_delta_replaces_stored_value(service: BaseSessionService) -> None:
    session = await service.create_session(
        app_name="app", user_id="u", state={"profile": {"name": "ada", "role": "admin"}}
    )
    await service.append_event(session, _event(text="x", state={"profile": {"name": "bob"}}))
    assert session.state["profile"] == {"name": "bob"}
    again = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert again is not None
    assert again.state["profile"] == {"name": "bob"}


@contract
async def test_none_valued_state_delta_is_stored_not_dropped(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u", state={"k": "v"})
    await service.append_event(session, _event(text="x", state={"k": None}))
    again = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert again is not None
    assert "k" in again.state
    assert again.state["k"] is None


@contract
async def test_boolean_state_survives_unrelated_state_delta(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u", state={"flag": False})
    await service.append_event(session, _event(text="x", state={"other": 1}))
    again = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert again is not None
    assert again.state["flag"] is False


@contract
async def test_app_state_dict_valued_delta_replaces_stored_value(
    service: BaseSessionService,
) -> None:
    session = await service.create_session(
        app_name="app", user_id="u1", state={"app:cfg": {"a": 1, "b": 2}}
    )
    await service.append_event(session, _event(text="x", state={"app:cfg": {"a": 3}}))
    other = await service.create_session(app_name="app", user_id="u2")
    assert other.state["app:cfg"] == {"a": 3}


@contract
async def test_user_state_none_valued_delta_is_stored_not_dropped(
    service: BaseSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u", state={"user:k": 1})
    await service.append_event(session, _event(text="x", state={"user:k": None}))
    later = await service.create_session(app_name="app", user_id="u")
    assert "user:k" in later.state
    assert later.state["user:k"] is None


@contract
async def test_temp_state_is_not_persisted_in_state_or_events(
    service: BaseSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    event = _event(text="x", state={"temp:scratch": 1, "kept": 2})
    await service.append_event(session, event)
    assert session.state["temp:scratch"] == 1
    assert "temp:scratch" not in event.actions.state_delta
    again = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert again is not None
    assert "temp:scratch" not in again.state
    assert again.state["kept"] == 2
    assert all("temp:scratch" not in e.actions.state_delta for e in again.events)


@contract
async def test_temp_state_visible_across_sequential_events(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    await service.append_event(session, _event(text="one", state={"temp:step": "first"}))
    assert session.state["temp:step"] == "first"
    await service.append_event(session, _event(text="two", author="agent"))
    assert session.state["temp:step"] == "first"


@contract
async def test_get_session_respects_user_id(service: BaseSessionService) -> None:
    one = await service.create_session(app_name="app", user_id="u1", session_id="s")
    await service.append_event(one, _event(text="x"))
    two = await service.create_session(app_name="app", user_id="u2", session_id="s")
    got = await service.get_session(app_name="app", user_id="u2", session_id="s")
    assert got is not None
    assert len(got.events) == 0
    assert two.id == "s"
    got_one = await service.get_session(app_name="app", user_id="u1", session_id="s")
    assert got_one is not None
    assert len(got_one.events) == 1


@contract
async def test_create_session_with_existing_id_raises_error(service: BaseSessionService) -> None:
    await service.create_session(app_name="app", user_id="u", session_id="dup")
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name="app", user_id="u", session_id="dup")


@contract
async def test_padded_session_id_reads_and_deletes(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="order-42\n")
    assert session.id == "order-42"
    got = await service.get_session(app_name="app", user_id="u", session_id=" order-42\n")
    assert got is not None
    assert got.id == "order-42"
    await service.delete_session(app_name="app", user_id="u", session_id="order-42\n")
    assert await service.get_session(app_name="app", user_id="u", session_id="order-42") is None


@contract
async def test_append_event_bytes(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    blob = bytes(range(256)) * 4
    event = Event(
        invocation_id="inv",
        author="user",
        content=types.Content(
            role="user", parts=[types.Part.from_bytes(data=blob, mime_type="image/png")]
        ),
        grounding_metadata=types.GroundingMetadata(
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"\x00\xffblob")
        ),
    )
    await service.append_event(session, event)
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert got.events[0].content.parts[0].inline_data.data == blob
    assert got.events[0].grounding_metadata.search_entry_point.sdk_blob == b"\x00\xffblob"
    assert got.events == session.events


@contract
async def test_append_event_complete(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    event = Event(
        invocation_id="inv",
        author="agent",
        content=types.Content(role="model", parts=[types.Part(text="done")]),
        turn_complete=True,
        partial=False,
        actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="other", escalate=True),
        long_running_tool_ids={"tool-1"},
        error_code="E1",
        error_message="an error",
        interrupted=False,
        grounding_metadata=types.GroundingMetadata(web_search_queries=["q"]),
        usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=3),
        citation_metadata=types.CitationMetadata(citations=[types.Citation(title="t")]),
        custom_metadata={"k": "v"},
        timestamp=1700000000.123,
        input_transcription=types.Transcription(text="in", finished=True),
        output_transcription=types.Transcription(text="out", finished=True),
    )
    await service.append_event(session, event)
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got == session


@contract
async def test_append_event_with_requested_tool_confirmations(
    service: BaseSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    confirmation = ToolConfirmation(hint="sure?", confirmed=False, payload={"x": 1})
    event = Event(
        invocation_id="inv",
        author="agent",
        actions=EventActions(requested_tool_confirmations={"call-1": confirmation}),
    )
    await service.append_event(session, event)
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert got.events[0].actions.requested_tool_confirmations == {"call-1": confirmation}


@contract
async def test_session_last_update_time_updates_on_event(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    stamp = session.last_update_time + 10
    await service.append_event(session, _event(text="x", timestamp=stamp))
    assert session.last_update_time == pytest.approx(stamp, abs=1e-6)
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert got.last_update_time == pytest.approx(stamp, abs=1e-6)


@contract
async def test_get_session_with_config(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    base = time.time()
    for i in range(1, 6):
        await service.append_event(session, _event(text=f"e{i}", timestamp=base + i))

    async def get(config: GetSessionConfig | None) -> list[float]:
        got = await service.get_session(
            app_name="app", user_id="u", session_id=session.id, config=config
        )
        assert got is not None
        return [e.timestamp - base for e in got.events]

    assert len(await get(None)) == 5
    assert await get(GetSessionConfig(num_recent_events=0)) == []
    assert await get(GetSessionConfig(num_recent_events=3)) == pytest.approx([3, 4, 5])
    assert await get(GetSessionConfig(after_timestamp=base + 4)) == pytest.approx([4, 5])
    assert await get(GetSessionConfig(after_timestamp=base + 6)) == []
    both = GetSessionConfig(num_recent_events=3, after_timestamp=base + 4)
    assert await get(both) == pytest.approx([4, 5])


@contract
async def test_partial_events_are_not_persisted(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    await service.append_event(session, _event(text="par", author="agent", partial=True))
    assert session.events == []
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert got.events == []


@contract
async def test_get_user_state_returns_empty_dict_when_no_state_exists(
    service: BaseSessionService,
) -> None:
    assert not await service.get_user_state(app_name="app", user_id="nobody")


@contract
async def test_get_user_state_returns_state_written_via_append_event(
    service: BaseSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    delta = {"user:profile": {"name": "ada"}, "session_key": 1}
    await service.append_event(session, _event(text="x", state=delta))
    assert await service.get_user_state(app_name="app", user_id="u") == {"profile": {"name": "ada"}}


@contract
async def test_get_user_state_is_not_visible_across_users(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u1")
    await service.append_event(session, _event(text="x", state={"user:k": 1}))
    assert not await service.get_user_state(app_name="app", user_id="u2")


@contract
async def test_get_user_state_is_not_visible_across_apps(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    await service.append_event(session, _event(text="x", state={"user:k": 1}))
    assert not await service.get_user_state(app_name="other", user_id="u")


@contract
async def test_get_user_state_available_before_session_is_created(
    service: BaseSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u", state={"user:k": "v"})
    await service.delete_session(app_name="app", user_id="u", session_id=session.id)
    assert await service.get_user_state(app_name="app", user_id="u") == {"k": "v"}


@contract
async def test_get_user_state_reflects_latest_write(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    await service.append_event(session, _event(text="x", state={"user:counter": 1}))
    await service.append_event(session, _event(text="y", state={"user:counter": 2}))
    assert (await service.get_user_state(app_name="app", user_id="u"))["counter"] == 2


@contract
async def test_get_session_keeps_exact_epoch_across_a_repeated_local_hour(
    service: BaseSessionService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        session = await service.create_session(app_name="app", user_id="u")
        stamps = [1730613600.0, 1730615400.0]  # both in the repeated 01:00 of 2024-11-03
        for stamp in stamps:
            await service.append_event(session, _event(text="x", timestamp=stamp))
        got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
        assert got is not None
        assert [e.timestamp for e in got.events] == stamps
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# ---- what ADK pins to its database service, and what episodic adds ------------------------


@ours
async def test_append_event_to_stale_session(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    stale = copy.deepcopy(session)
    await service.append_event(session, _event(text="first"))
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(stale, _event(text="second", state={"k": 1}))
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert [e.content.parts[0].text for e in got.events] == ["first"]
    assert "k" not in got.state


@ours
async def test_concurrent_stale_sessions_reject_stale_writer(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    for round_ in range(8):
        latest = await service.get_session(app_name="app", user_id="u", session_id=session.id)
        assert latest is not None
        copies = [copy.deepcopy(latest), copy.deepcopy(latest)]
        results = await asyncio.gather(
            *(service.append_event(c, _event(text=f"r{round_}-{i}")) for i, c in enumerate(copies)),
            return_exceptions=True,
        )
        stale = [r for r in results if isinstance(r, StaleSessionError)]
        assert len(stale) == 1, results
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert len(got.events) == 8


@ours
async def test_append_event_to_deleted_session_raises_session_not_found(
    service: BaseSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    await service.delete_session(app_name="app", user_id="u", session_id=session.id)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, _event(text="late"))
    fresh = copy.deepcopy(session)
    fresh._storage_update_marker = None  # a session ADK did not load: no revision to check
    with pytest.raises(SessionNotFoundError):
        await service.append_event(fresh, _event(text="late"))


@ours
async def test_get_session_orders_tied_timestamps_by_id(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    for event_id in ("c", "a", "b"):
        await service.append_event(session, _event(text=event_id, id=event_id, timestamp=100.0))
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert [e.id for e in got.events] == ["a", "b", "c"]


@ours
async def test_non_serializable_state_delta_is_refused_with_nothing_written(
    service: EpisodicSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    before = copy.deepcopy(session)
    with pytest.raises(ValidationError, match="JSON"):
        await service.append_event(session, _event(text="x", state={"fn": lambda: 1}))
    assert session == before
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got == before
    cid = session_conversation_id("app", "u", session.id)
    assert await service.store.read_events(cid) == []
    await service.append_event(session, _event(text="still writable"))


@ours
async def test_append_event_is_idempotent_for_same_event_id(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u", state={"n": 0})
    event = _event(text="once", state={"user:count": 1})
    await service.append_event(session, event)
    await service.append_event(session, event)
    await service.append_event(session, copy.deepcopy(event))
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert [e.id for e in got.events] == [event.id]
    assert len(session.events) == 1
    stale_copy = copy.deepcopy(got)
    await service.append_event(stale_copy, _event(text="next"))
    await service.append_event(got, copy.deepcopy(event))  # stale, but the same event: fine


@ours
async def test_append_different_events_not_deduplicated(service: BaseSessionService) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    await service.append_event(session, _event(text="one", id="same"))
    await service.append_event(session, _event(text="two", id="same"))
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert [e.content.parts[0].text for e in got.events] == ["one", "two"]


@ours
async def test_delete_keeps_the_log_and_hides_the_session(
    service: EpisodicSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u", session_id="s")
    await service.append_event(session, _event(text="kept"))
    await service.delete_session(app_name="app", user_id="u", session_id="s")
    await service.delete_session(app_name="app", user_id="u", session_id="s")  # no error
    assert (await service.list_sessions(app_name="app", user_id="u")).sessions == []
    first = session_conversation_id("app", "u", "s")
    assert [e.kind for e in await service.store.read_events(first)] == ["message", "deletion"]

    # The id can be used again, as with ADK's own services: a new session, the old log kept.
    again = await service.create_session(
        app_name="app", user_id="u", session_id="s", state={"n": 2}
    )
    assert again.events == []
    await service.append_event(again, _event(text="new"))
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    assert [e.content.parts[0].text for e in got.events] == ["new"]
    assert got.state == {"n": 2}
    assert [s.id for s in (await service.list_sessions(app_name="app")).sessions] == ["s"]
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, _event(text="to the deleted one"))
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name="app", user_id="u", session_id="s")
    assert [e.kind for e in await service.store.read_events(first)] == ["message", "deletion"]

    # And again, through a session object ADK did not read (no revision marker).
    await service.delete_session(app_name="app", user_id="u", session_id="s")
    third = await service.create_session(app_name="app", user_id="u", session_id="s")
    handmade = copy.deepcopy(third)
    handmade._storage_update_marker = None
    await service.append_event(handmade, _event(text="third"))
    got = await service.get_session(
        app_name="app", user_id="u", session_id="s", config=GetSessionConfig(num_recent_events=0)
    )
    assert got is not None
    assert got.events == []
    got = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert got is not None
    assert [e.content.parts[0].text for e in got.events] == ["third"]
    await service.append_event(got, _event(text="fourth"))


@ours
async def test_function_calls_pair_and_an_orphan_response_is_refused(
    service: EpisodicSessionService,
) -> None:
    session = await service.create_session(app_name="app", user_id="u")
    call = types.Part(function_call=types.FunctionCall(id="c1", name="weather", args={"q": 1}))
    await service.append_event(
        session, Event(author="agent", content=types.Content(role="model", parts=[call]))
    )
    answer = types.Part(
        function_response=types.FunctionResponse(id="c1", name="weather", response={"t": 21})
    )
    await service.append_event(
        session, Event(author="agent", content=types.Content(role="user", parts=[answer]))
    )
    orphan = types.Part(
        function_response=types.FunctionResponse(id="nope", name="weather", response={})
    )
    with pytest.raises(ValidationError):
        await service.append_event(
            session, Event(author="agent", content=types.Content(role="user", parts=[orphan]))
        )
    got = await service.get_session(app_name="app", user_id="u", session_id=session.id)
    assert got is not None
    assert len(got.events) == 2
    assert got.events == session.events


@ours
async def test_erase_session_removes_every_generation_and_the_id_starts_over(
    service: EpisodicSessionService,
) -> None:
    first = await service.create_session(app_name="app", user_id="u", session_id="s")
    await service.append_event(first, _event(text="a secret"))
    await service.delete_session(app_name="app", user_id="u", session_id="s")
    second = await service.create_session(app_name="app", user_id="u", session_id="s")
    await service.append_event(second, _event(text="another secret"))
    erased = await service.erase_session(
        app_name="app", user_id="u", session_id="s", reason="user asked"
    )
    assert [e.events for e in erased] == [2, 1]  # message, deletion; message
    store = service.store
    for generation in (0, 1):
        with pytest.raises(NotFoundError):
            await store.read_events(session_conversation_id("app", "u", "s", "default", generation))
    assert await service.get_session(app_name="app", user_id="u", session_id="s") is None
    fresh = await service.create_session(app_name="app", user_id="u", session_id="s")
    assert fresh.events == []
    found = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert found is not None
    assert found.events == []
