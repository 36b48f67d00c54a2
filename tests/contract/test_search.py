"""store.search: a conversation's own messages found by their words, on both backends alike:
tool outputs and calls included, ranked by the words they hold (the rarer, the weightier)
and then the newest, nothing retracted, cleared, another tenant's or erased."""

from __future__ import annotations

import re
from uuid import UUID, uuid4

import pytest

from episodic import (
    EpisodicStore,
    ErasedConversationError,
    Message,
    NotFoundError,
    TextBlock,
    ToolCall,
    ValidationError,
)
from episodic.search import (
    MAX_SEARCH_LIMIT,
    MAX_TERMS,
    QUERY_PATTERN,
    excerpt,
    prefix_forms,
    query_terms,
    rank_hits,
)
from tests.support import snapshot


async def _session(store: EpisodicStore) -> UUID:
    """A short debugging session: seqs 1-6."""
    conv = await store.create_conversation()
    await store.append(conv, [Message.user("Fix the failing login test in tests/test_auth.py")])
    await store.append(
        conv,
        [
            Message.assistant(
                "Running it.",
                tool_calls=[
                    ToolCall(id="c1", name="shell", args={"cmd": "pytest tests/test_auth.py -x"})
                ],
            ),
            Message.tool_result("c1", "FAILED test_login - AuthError E-2147: token expired"),
        ],
    )
    await store.append(
        conv, [Message.assistant([TextBlock(text="The token check in src/auth/tokens.py fails.")])]
    )
    await store.append(conv, [Message.user("Keep the old token format for now.")])
    await store.append(conv, [Message.assistant("Understood: the old token format stays.")])
    return conv


async def _seqs(store: EpisodicStore, conv: UUID, query: str, **options: int) -> list[int]:
    return [hit.seq for hit in await store.search(conv, query, **options)]


async def test_finds_tool_outputs_calls_and_blocks_by_their_words(store: EpisodicStore) -> None:
    conv = await _session(store)
    assert await _seqs(store, conv, "E-2147") == [3]
    assert await _seqs(store, conv, "e 2147") == [3]
    # a tool call's arguments and name, and its result (3) by them too: the newest first
    assert await _seqs(store, conv, "pytest") == [3, 2]
    assert await _seqs(store, conv, "shell") == [3, 2]
    assert await _seqs(store, conv, "cmd") == [3, 2]  # the arguments' names too
    assert await _seqs(store, conv, "tokens.py") == [4]  # a content block
    # a path's parts, and stemming: "failed" finds "failing" and "fails"
    assert await _seqs(store, conv, "test_auth.py") == [3, 2, 1]
    assert await _seqs(store, conv, "failed") == [4, 3, 1]
    hits = await store.search(conv, "E-2147")
    assert hits[0].message.role == "tool"
    assert hits[0].message.tool_call_id == "c1"


async def test_rarer_words_weigh_more_and_ties_go_to_the_newest(store: EpisodicStore) -> None:
    conv = await _session(store)
    # 6 and 5 hold "old token format", 4 and 3 only "token" (in 4 of the 6 messages)
    assert await _seqs(store, conv, "old token format") == [6, 5, 4, 3]
    # "login" is in 2 messages, "token" in 4: 3 holds both, then 1 ("login"), then the rest
    assert await _seqs(store, conv, "token login") == [3, 1, 6, 5, 4]
    # a long word is a prefix too ("underst" finds "Understood"), and one of six letters or
    # more also without its last two ("decide" finds "Decision"); a call's id is not text
    assert await _seqs(store, conv, "underst") == [6]
    assert await _seqs(store, conv, "c1") == []
    await store.append(conv, [Message.assistant("Decision: no migration.")])
    assert await _seqs(store, conv, "decide") == [7]
    assert await _seqs(store, conv, "old token format", limit=2) == [6, 5]
    assert await _seqs(store, conv, "what is the") == []  # stop words only
    assert await _seqs(store, conv, "kubernetes") == []


async def test_retracted_and_cleared_messages_are_not_found(store: EpisodicStore) -> None:
    conv = await _session(store)
    await store.append(conv, [Message.user("a secret word: zanzibar")])
    assert await _seqs(store, conv, "zanzibar") == [7]
    await store.retract_last(conv)
    assert await _seqs(store, conv, "zanzibar") == []
    await store.clear(conv)
    assert await _seqs(store, conv, "token") == []
    await store.append(conv, [Message.user("a new token")])
    assert await _seqs(store, conv, "token") == [10]


async def test_a_message_holding_a_nul_is_searched_with_the_rest(store: EpisodicStore) -> None:
    # found by the HTTP fuzzer: PostgreSQL's jsonb cannot hold the \u0000 a message's JSON
    # keeps, and the whole search failed as "cannot store this input"
    conv = await store.create_conversation()
    call = ToolCall(id="c1", name="run", args={"cmd": "zanzibar\u0000 -x"})
    await store.append(
        conv,
        [
            Message.user("zanzibar, then a nul\u0000 and C:\\u0000 as text"),
            Message.assistant(tool_calls=[call]),
            Message.tool_result("c1", "ran\u0000 ok", name="run"),
        ],
    )
    assert await _seqs(store, conv, "zanzibar") == [3, 2, 1]


async def test_query_syntax_of_either_database_is_only_words(store: EpisodicStore) -> None:
    conv = await _session(store)
    for query in ('"', "NEAR(token format)", "token*", "a OR b", "!(token)", "x\x00y", "'; --"):
        await store.search(conv, query)  # no error, whatever the backend's own syntax
    assert await _seqs(store, conv, "token*") == await _seqs(store, conv, "token")


async def test_bad_input_is_refused_and_changes_nothing(
    store: EpisodicStore, database_url: str
) -> None:
    conv = await _session(store)
    before = await snapshot(database_url)
    for query, limit in (("", 10), ("  \n", 10), ("x" * 2_001, 10), ("x", 0), ("x", 101)):
        with pytest.raises(ValidationError):
            await store.search(conv, query, limit=limit)
    with pytest.raises(ValidationError):
        await store.search(conv, None, limit=10)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await store.search("not-a-uuid", "token")
    with pytest.raises(NotFoundError):
        await store.search(uuid4(), "token")
    assert await snapshot(database_url) == before
    assert len(await store.search(conv, "token", limit=MAX_SEARCH_LIMIT)) == 4


async def test_a_tenant_searches_only_its_own(store: EpisodicStore) -> None:
    acme = store.for_tenant("acme")
    conv = await _session(acme)
    assert await _seqs(acme, conv, "E-2147 token") == [3, 6, 5, 4]
    with pytest.raises(NotFoundError):
        await store.for_tenant("globex").search(conv, "token")


async def test_an_erased_conversation_finds_nothing(store: EpisodicStore) -> None:
    conv = await _session(store)
    await store.erase_conversation(conv, reason="user request")
    with pytest.raises((NotFoundError, ErasedConversationError)):
        await store.search(conv, "token")
    again = await _session(store)  # a new conversation holds the same words
    assert await _seqs(store, again, "E-2147") == [3]


@pytest.mark.parametrize("query", ["\x1c", "\x85 \x1f", "\ufeff", "\u00a0\u3000", "\t\n"])
def test_a_query_of_white_space_in_any_engines_sense_is_refused_as_the_api_schema_says(
    query: str,
) -> None:
    # the HTTP API's schema states QUERY_PATTERN (a fuzzer found "\x1c" admitted by it and
    # refused here): the library and the schema agree on what is blank
    assert re.search(QUERY_PATTERN, query) is None
    with pytest.raises(ValidationError, match="non-empty"):
        query_terms(query)
    assert query_terms(query + "E2147") == ("e2147",)


def test_query_terms_are_lowered_deduplicated_and_bounded() -> None:
    assert query_terms("What did the Failing TEST say about E2147? The test!") == (
        "failing",
        "test",
        "e2147",
    )
    # an identifier or a path is one term, searched as a phrase of its parts
    assert query_terms("see src/app/models.py and ERR_TIMEOUT") == (
        "see",
        "src/app/models.py",
        "err_timeout",
    )
    assert len(query_terms(" ".join(f"w{i}" for i in range(40)))) == MAX_TERMS


def test_an_excerpt_shows_where_a_long_text_matched() -> None:
    text = "line " * 300 + "FAILED test_login AuthError E2147 token expired " + "tail " * 300
    shown = excerpt(text, ("e2147",), 120)
    assert "E2147" in shown
    assert shown.startswith("[...] ")
    assert shown.endswith(" [...]")
    assert len(shown) <= 120 + 12
    assert "E2147" in excerpt(text, ("failing",), 120)  # by its first letters: "fail"
    assert excerpt(text, ("absent",), 60).startswith("line line")
    assert excerpt("short", ("x",), 60) == "short"


def test_ranking_weighs_each_word_by_its_rarity() -> None:
    # 10 messages; term 0 in 1 of them (seq 3), term 1 in 5 of them
    hits = [(3, 0), *((seq, 1) for seq in (2, 4, 6, 8, 10))]
    assert rank_hits(hits, documents=10, limit=3) == [3, 10, 8]
    assert rank_hits([(3, 1), (3, 0), (9, 0)], documents=10, limit=5) == [3, 9]
    assert rank_hits([], documents=10, limit=5) == []
    assert prefix_forms("e-2147") == ()  # a phrase of its parts, as written
    assert prefix_forms("log") == ()
    assert prefix_forms("call") == ("call",)
    assert prefix_forms("decide") == ("decide", "deci")


async def test_a_tool_result_is_found_by_the_call_it_answers(store: EpisodicStore) -> None:
    conv = await store.create_conversation()
    for name, output in (("lookup_account", "ACC-1: plan Team"), ("read_log", "all quiet")):
        # the same call id twice: each result holds its own call's words, not the other's
        call = ToolCall(id="c1", name=name, args={"customer": "Okafor"})
        await store.append(
            conv, [Message.assistant(None, tool_calls=[call]), Message.tool_result("c1", output)]
        )
    assert await _seqs(store, conv, "account") == [2, 1]
    assert await _seqs(store, conv, "read_log") == [4, 3]
    assert await _seqs(store, conv, "customer") == [4, 3, 2, 1]
