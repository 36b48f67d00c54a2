"""The compaction facts of DESIGN.md section 3: estimates, the source cap, retained user
messages, truncation, finalizing, and reasoning excerpts."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episodic.compaction import (
    DEFAULT_COMPACTION_PROMPT,
    DEFAULT_SUMMARY_PREFIX,
    NO_SUMMARY_TEXT,
    PROMPT_VERSION,
    RECALL_TEMPLATE,
    TRANSCRIPT_HEADER,
    TRUNCATION_MARKER,
    CompactionConfig,
    HandoffPlan,
    estimate_transcript_tokens,
    finalize_compaction,
    prepare_compaction,
    select_retained_user_messages,
    should_compact,
    truncate_to_token_budget,
    user_text,
)
from episodic.errors import ValidationError
from episodic.models import ImageBlock, Message, TextBlock, ToolCall
from episodic.rendering import (
    REASONING_CUT_MARKER,
    TOOL_RESULT_CUT_MARKER,
    excerpt_reasoning,
    render_message,
)
from episodic.tokens import CharHeuristic

from .conversations import valid_histories

CHARS = CharHeuristic()
EMOJI = "\N{GRINNING FACE}"
MARKER_BYTES = len(TRUNCATION_MARKER.encode())


def _config(auto: int = 0, request: int = 1_000_000, retained: int = 1_000) -> CompactionConfig:
    return CompactionConfig().with_limits(
        auto_compact_token_limit=auto,
        compact_request_token_limit=request,
        recent_user_token_budget=retained,
    )


# ---- token estimates --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("é", 1), (EMOJI, 1), ("é" * 3, 2)],
)
def test_char_heuristic_counts_utf8_bytes_over_four_rounded_up(text: str, tokens: int) -> None:
    assert CHARS.count(text) == tokens


def test_char_heuristic_allows_four_chars_per_token() -> None:
    assert [CHARS.max_chars_for_tokens(t) for t in (0, 1, 25)] == [0, 4, 100]


def test_transcript_estimate_is_the_sum_over_rendered_messages() -> None:
    messages = [
        Message.user("Fix the failing test"),
        Message.assistant(None, tool_calls=[ToolCall(id="c1", name="run", args={"x": 1})]),
        Message.tool_result("c1", "1 failed", name="run", is_error=True),
    ]
    expected = sum(CHARS.count(render_message(m)) for m in messages)
    assert estimate_transcript_tokens(messages, CHARS) == expected
    assert estimate_transcript_tokens([], CHARS) == 0


# ---- when to compact -------------------------------------------------------------------


@pytest.mark.parametrize(("estimate", "due"), [(99, False), (100, True), (101, True)])
def test_should_compact_at_or_over_the_limit(estimate: int, due: bool) -> None:
    assert should_compact(estimate, _config(auto=100)) is due


def test_a_disabled_config_never_compacts() -> None:
    disabled = CompactionConfig.disabled()
    assert not should_compact(10**12, disabled)
    assert prepare_compaction([Message.user("x" * 10_000)], disabled, CHARS) is None


def test_defaults_are_tuned_for_a_large_window() -> None:
    config = CompactionConfig()
    assert (
        config.auto_compact_token_limit,
        config.compact_request_token_limit,
        config.recent_user_token_budget,
    ) == (300_000, 250_000, 20_000)
    assert config.enabled


def test_with_limits_replaces_only_what_it_is_given_and_validates() -> None:
    config = CompactionConfig().with_limits(recent_user_token_budget=5)
    assert config.recent_user_token_budget == 5
    assert config.auto_compact_token_limit == 300_000
    with pytest.raises(ValidationError, match="greater than or equal to 0") as caught:
        CompactionConfig().with_limits(auto_compact_token_limit=-1)
    assert caught.value.field == "auto_compact_token_limit"


@pytest.mark.parametrize(
    "fields",
    [
        {"auto_compact_token_limit": -1},
        {"summary_prefix": ""},
        {"enabled": "sometimes"},
        {"colour": "red"},
    ],
)
def test_config_refuses_with_episodic_validation_error(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=r"^invalid CompactionConfig: ") as caught:
        CompactionConfig(**fields)
    assert not isinstance(caught.value, pydantic.ValidationError)
    assert [problem["loc"][0] for problem in caught.value.errors()] == list(fields)


def test_config_is_frozen() -> None:
    with pytest.raises(ValueError, match="frozen"):
        CompactionConfig().enabled = False


def test_below_the_limit_nothing_is_prepared() -> None:
    messages = [Message.user("abcd")]
    limit = estimate_transcript_tokens(messages, CHARS)
    assert prepare_compaction(messages, _config(auto=limit + 1), CHARS) is None
    assert prepare_compaction(messages, _config(auto=limit), CHARS) is not None
    assert prepare_compaction([], _config(auto=0), CHARS) is None


# ---- the summary request ---------------------------------------------------------------


def _numbered(count: int, size: int = 40) -> list[Message]:
    """User messages m0..m{count-1}, each rendering to exactly ``size`` bytes / 10 tokens."""
    return [Message.user(f"m{i}".ljust(size - len("[user]\n"), ".")) for i in range(count)]


def _base_tokens() -> int:
    return CHARS.count(f"{DEFAULT_COMPACTION_PROMPT}\n\n{TRANSCRIPT_HEADER}")


def test_prompt_holds_instructions_header_and_every_message_when_under_the_cap() -> None:
    messages = _numbered(3)
    prepared = prepare_compaction(messages, _config(), CHARS)
    assert prepared is not None
    prompt = prepared.request.prompt
    assert prompt.startswith(DEFAULT_COMPACTION_PROMPT)
    assert TRANSCRIPT_HEADER in prompt
    assert prompt.endswith("\n\n".join(render_message(m) for m in messages))
    assert "left out" not in prompt
    assert prepared.request.omitted_messages == 0
    assert prepared.request.source_messages == 3
    assert prepared.request.transcript_tokens == 30
    assert prepared.request.request_tokens == CHARS.count(prompt)


@pytest.mark.parametrize(
    ("room_in_messages", "kept"),
    [(5, 5), (4, 4), (3, 3), (1, 1)],
)
def test_source_cap_omits_the_oldest_contiguous_prefix(room_in_messages: int, kept: int) -> None:
    messages = _numbered(5)
    cap = _base_tokens() + 10 * room_in_messages
    prepared = prepare_compaction(messages, _config(request=cap), CHARS)
    assert prepared is not None
    request = prepared.request
    assert (request.source_messages, request.omitted_messages) == (kept, 5 - kept)
    prompt = request.prompt
    for i, message in enumerate(messages):
        assert (render_message(message) in prompt) is (i >= 5 - kept)


def test_source_cap_stops_at_the_first_message_that_does_not_fit() -> None:
    # Newest first: 10 fits, 30 does not, so the 5 before it is left out too.
    messages = [Message.user("a" * 13), Message.user("b" * 113), Message.user("c" * 33)]
    costs = [CHARS.count(render_message(m)) for m in messages]
    assert costs == [5, 30, 10]
    prepared = prepare_compaction(messages, _config(request=_base_tokens() + 20), CHARS)
    assert prepared is not None
    assert prepared.request.omitted_messages == 2
    assert "The 2 oldest messages were left out" in prepared.request.prompt


def test_the_omitted_note_uses_the_singular_for_one() -> None:
    prepared = prepare_compaction(_numbered(2), _config(request=_base_tokens() + 10), CHARS)
    assert prepared is not None
    assert "The 1 oldest message was left out" in prepared.request.prompt


def test_the_newest_message_is_kept_even_when_it_alone_is_over_the_cap() -> None:
    messages = [Message.user("old"), Message.user("x" * 4_000)]
    prepared = prepare_compaction(messages, _config(request=1), CHARS)
    assert prepared is not None
    assert (prepared.request.source_messages, prepared.request.omitted_messages) == (1, 1)
    assert "x" * 4_000 in prepared.request.prompt


def test_the_prompt_asks_for_a_form_of_new_notes_and_guards_private_reasoning() -> None:
    prompt = DEFAULT_COMPACTION_PROMPT.lower()
    for phrase in (
        "handoff notes",
        "this exact session",
        "fill in this form",
        "## goal",
        "## decisions",
        "## next steps",
        "## reproduce",
        "## facts",
        "exactly as written",
        "add only what the notes so far do not say",
        "not done until a tool result shows it",
        "durable findings",
        "open questions",
        "never reproduce the reasoning",
        "encoded payload",
    ):
        assert phrase in prompt, phrase
    assert "## done" not in prompt  # what was done is the record's to say
    assert PROMPT_VERSION == "episodic-handoff-5"


def test_reasoning_is_rendered_for_the_summarizer_but_native_payloads_are_not() -> None:
    message = Message.assistant("done", reasoning="because x" * 1_000)
    prepared = prepare_compaction([Message.user("go"), message], _config(), CHARS)
    assert prepared is not None
    assert "[private reasoning excerpt]" in prepared.request.prompt
    assert REASONING_CUT_MARKER in prepared.request.prompt


# ---- retained user messages ------------------------------------------------------------

ONE, TWO, EMPTY, ONE_AGAIN = "abcd", "abcdefgh", "", "wxyz"


@pytest.mark.parametrize(
    ("budget", "retained"),
    [
        (0, ()),
        (1, (ONE_AGAIN,)),
        (3, (TWO, ONE_AGAIN)),
        (4, (ONE, TWO, ONE_AGAIN)),
        (100, (ONE, TWO, ONE_AGAIN)),
    ],
)
def test_retained_user_messages_newest_first_while_they_fit(
    budget: int, retained: tuple[str, ...]
) -> None:
    messages = [Message.user(t) for t in (ONE, TWO, EMPTY, ONE_AGAIN)]
    assert [CHARS.count(t) for t in (ONE, TWO, EMPTY, ONE_AGAIN)] == [1, 2, 0, 1]
    assert select_retained_user_messages(messages, budget, CHARS) == retained


def test_a_fragment_of_less_than_half_a_message_is_not_kept() -> None:
    long = "H" * 100 + "T" * 100  # 50 tokens, 20 of them would fit
    messages = [Message.user("older"), Message.user(long), Message.user("abcd")]
    assert select_retained_user_messages(messages, 21, CHARS) == ("abcd",)
    # the newest message is cut to any size: the handoff's reader needs its latest words
    (only,) = select_retained_user_messages([Message.user(long)], 5, CHARS)
    assert TRUNCATION_MARKER.strip() in only


def test_the_first_message_that_does_not_fit_is_truncated_and_selection_stops() -> None:
    long = "H" * 60 + "T" * 60  # 30 tokens, 29 left for it: more than half holds text
    messages = [Message.user("older"), Message.user(long), Message.user("abcd")]
    retained = select_retained_user_messages(messages, 30, CHARS)
    assert len(retained) == 2
    cut, newest = retained
    assert newest == "abcd"
    assert TRUNCATION_MARKER in cut
    assert cut.startswith("H")
    assert cut.endswith("T")
    assert len(cut.encode()) <= 4 * 29


def test_non_user_messages_and_earlier_handoffs_are_never_retained() -> None:
    handoff = finalize_compaction(
        HandoffPlan(retained_user_messages=(), summary_prefix=DEFAULT_SUMMARY_PREFIX), "s"
    )
    messages = [
        Message.user("keep me"),
        handoff.handoff,
        Message.assistant("assistant words"),
        Message.tool_result("c1", "tool words", name="run"),
        Message.system("system words"),
    ]
    assert select_retained_user_messages(messages, 1_000, CHARS) == ("keep me",)


def test_retention_is_chosen_from_the_whole_transcript_not_only_the_capped_source() -> None:
    messages = [Message.user("first request"), *_numbered(4)]
    prepared = prepare_compaction(messages, _config(request=_base_tokens() + 10), CHARS)
    assert prepared is not None
    assert prepared.request.omitted_messages == 4
    assert prepared.plan.retained_user_messages[0] == "first request"
    assert len(prepared.plan.retained_user_messages) == 5


def test_user_text_keeps_text_blocks_and_drops_images() -> None:
    blocks = (TextBlock(text="look"), ImageBlock(url="data:,", alt="a cat"), TextBlock(text="!"))
    assert user_text(Message.user(blocks)) == "look\n!"
    assert user_text(Message.user((ImageBlock(url="data:,"),))) == ""
    assert user_text(Message.assistant("no")) == ""


# ---- finalizing ------------------------------------------------------------------------


def test_finalize_writes_prefix_newline_trimmed_summary_then_retained_user_messages() -> None:
    plan = HandoffPlan(retained_user_messages=("a", "b"), summary_prefix="[P]")
    done = finalize_compaction(plan, "  the summary \n")
    assert done.handoff == Message.user("[P]\nthe summary")
    assert done.handoff.role == "user"
    assert done.retained == (Message.user("a"), Message.user("b"))
    assert [m.text for m in done.messages] == ["[P]\nthe summary", "a", "b"]
    assert done.handoff_text == "[P]\nthe summary"
    assert done.retained_texts == ("a", "b")


def test_a_plan_that_knows_its_cut_ends_the_handoff_with_where_to_search() -> None:
    plan = HandoffPlan(retained_user_messages=(), summary_prefix="[P]", notes_seq=41)
    text = finalize_compaction(plan, "## Goal\n- fix the login test").handoff_text
    assert text.endswith(RECALL_TEMPLATE.format(seq=41))
    assert "seq 41" in text
    assert "search" in text.lower()


@pytest.mark.parametrize("summary", ["", "   ", "\n\t"])
def test_an_empty_summary_finalizes_to_the_fixed_no_summary_text(summary: str) -> None:
    plan = HandoffPlan(retained_user_messages=(), summary_prefix=DEFAULT_SUMMARY_PREFIX)
    assert finalize_compaction(plan, summary).handoff_text == (
        f"{DEFAULT_SUMMARY_PREFIX}\n{NO_SUMMARY_TEXT}"
    )


def test_the_default_prefix_says_it_is_runtime_context_not_an_instruction() -> None:
    prefix = DEFAULT_SUMMARY_PREFIX.lower()
    assert "runtime context" in prefix
    assert "not a new instruction" in prefix


# ---- truncation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "budget", "expected"),
    [
        ("abcd", 1, "abcd"),
        ("", 0, ""),
        ("abcde", 0, ""),
        ("0123456789" * 4, 2, TRUNCATION_MARKER.lstrip("\n") + "23456789"),
        (
            "H" * 50 + "T" * 50,
            20,
            "H" * ((80 - MARKER_BYTES) // 2)
            + TRUNCATION_MARKER
            + "T" * (80 - MARKER_BYTES - (80 - MARKER_BYTES) // 2),
        ),
    ],
)
def test_truncation_table(text: str, budget: int, expected: str) -> None:
    assert truncate_to_token_budget(text, budget, CHARS) == expected


def test_truncation_never_splits_a_multibyte_character() -> None:
    out = truncate_to_token_budget(EMOJI * 40, 20, CHARS)
    head, tail = out.split(TRUNCATION_MARKER)
    assert set(head) == {EMOJI}
    assert set(tail) == {EMOJI}
    assert len(out.encode()) <= 80


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), budget=st.integers(0, 60))
def test_truncation_is_valid_utf8_within_budget_plus_marker(text: str, budget: int) -> None:
    out = truncate_to_token_budget(text, budget, CHARS)
    encoded = out.encode("utf-8")  # raises on a broken character
    assert len(encoded) <= 4 * budget + MARKER_BYTES
    if CHARS.count(text) <= budget:
        assert out == text
    elif budget > 0:
        marker = TRUNCATION_MARKER if TRUNCATION_MARKER in out else TRUNCATION_MARKER.lstrip("\n")
        head, _, tail = out.partition(marker)
        assert text.startswith(head)
        assert text.endswith(tail)


# ---- private reasoning excerpts --------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=400), cap=st.integers(0, 300))
def test_reasoning_excerpts_never_exceed_their_cap(text: str, cap: int) -> None:
    excerpt = excerpt_reasoning(text, cap)
    assert len(excerpt) <= cap
    if len(text) <= cap:
        assert excerpt == text


def test_reasoning_keeps_a_third_head_and_two_thirds_tail() -> None:
    text = "h" * 3_000 + "t" * 3_000
    excerpt = excerpt_reasoning(text, 2_000)
    head, tail = excerpt.split(REASONING_CUT_MARKER)
    room = 2_000 - len(REASONING_CUT_MARKER)
    assert (len(head), len(tail)) == (room // 3, room - room // 3)


@settings(max_examples=60, deadline=None)
@given(messages=valid_histories())
def test_rendered_reasoning_stays_within_the_configured_cap(messages: list[Message]) -> None:
    config = _config().model_copy(update={"reasoning_char_cap": 50})
    prepared = prepare_compaction(messages, config, CHARS)
    assert prepared is not None
    for message in messages:
        if message.reasoning:
            rendered = render_message(message, reasoning_char_cap=50)
            assert rendered in prepared.request.prompt
            excerpt = rendered.split("[private reasoning excerpt]\n", 1)[1]
            assert len(excerpt) <= 50


def test_the_model_sees_a_tool_results_head_and_the_record_reads_all_of_it() -> None:
    noise = "\n".join(f"12:00:{i:02d} INFO worker[{i}] request handled" for i in range(40))
    output = f"{noise}\nFAILED test_twice - SyncError: LEDGER-E4242"
    messages = [
        Message.user("Fix the double post."),
        Message.assistant(tool_calls=[ToolCall(id="c1", name="run", args={"command": "pytest"})]),
        Message.tool_result("c1", output, name="run"),
        Message.assistant("Reproduced."),
    ]
    config = _config().with_limits(tool_result_char_cap=120)
    prepared = prepare_compaction(messages, config, CHARS)
    assert prepared is not None
    prompt = prepared.request.prompt
    transcript = prompt.split(TRANSCRIPT_HEADER, 1)[1]
    more = len(output) - 120
    assert output[:120] + TOOL_RESULT_CUT_MARKER.format(more=more) in transcript
    assert output[120:] not in transcript
    # the record above the transcript was folded from the whole result
    assert "LEDGER-E4242" in prompt.split(TRANSCRIPT_HEADER, 1)[0]
    assert prepared.request.transcript_tokens < estimate_transcript_tokens(messages, CHARS)
    uncut = prepare_compaction(messages, _config(), CHARS)
    assert uncut is not None
    assert output in uncut.request.prompt


# ---- building on the previous boundary -----------------------------------------------------

FAILING_RUN = [
    Message.user("Fix the double post. Never add a new HTTP client."),
    Message.assistant(tool_calls=[ToolCall(id="c1", name="run", args={"command": "pytest -x"})]),
    Message.tool_result("c1", "FAILED test_twice - SyncError: LEDGER-E4242\n1 failed", name="run"),
    Message.assistant("Reproduced; the fix goes in src/sync.py."),
]


def test_a_compaction_builds_on_the_previous_notes_and_record_and_shows_only_what_is_new() -> None:
    config = _config()
    first = prepare_compaction(FAILING_RUN, config, CHARS, cut_seq=4)
    assert first is not None
    done = finalize_compaction(first.plan, "## Goal\nFix the double post.", CHARS)
    assert [n.text for n in done.state.notes] == ["Fix the double post."]
    assert [c.command for c in done.state.worklog.commands] == ["pytest -x"]

    later = [
        *done.messages,
        Message.user("Check the search log."),
        Message.assistant("The search log is quiet."),
    ]
    second = prepare_compaction(
        later, config, CHARS, previous=done.state, new_from=len(done.messages), cut_seq=7
    )
    assert second is not None
    prompt = second.request.prompt
    transcript = prompt.split(TRANSCRIPT_HEADER, 1)[1]
    assert "Check the search log." in transcript
    assert "Reproduced" not in prompt  # summarized already: only its notes are shown
    assert "Notes so far" in prompt
    assert "GOAL: Fix the double post." in prompt
    assert "LEDGER-E4242" in prompt  # the record carried from the first boundary
    assert second.request.source_messages == 2

    handoff = finalize_compaction(second.plan, "## Facts\n- The search log is quiet.", CHARS)
    text = handoff.handoff_text
    assert "GOAL: Fix the double post." in text  # the first compaction's note, as written
    assert "FACT: The search log is quiet." in text
    assert "pytest -x" in text
    assert "LEDGER-E4242" in text
    assert [n.seq for n in handoff.state.notes] == [4, 7]


def test_instructions_kept_word_for_word_beside_the_handoff_are_not_repeated_in_it() -> None:
    prepared = prepare_compaction(FAILING_RUN, _config(), CHARS)
    assert prepared is not None
    assert prepared.plan.retained_user_messages == (FAILING_RUN[0].text,)
    text = finalize_compaction(prepared.plan, "", CHARS).handoff_text
    assert "Never add a new HTTP client." not in text
    without_retention = prepare_compaction(FAILING_RUN, _config(retained=0), CHARS)
    assert without_retention is not None
    text = finalize_compaction(without_retention.plan, "", CHARS).handoff_text
    assert "Never add a new HTTP client." in text


def test_what_the_model_says_was_done_is_not_in_the_handoff() -> None:
    prepared = prepare_compaction(FAILING_RUN, _config(), CHARS)
    assert prepared is not None
    text = finalize_compaction(
        prepared.plan, "## Next steps\n- Write the test.\n## Done\n- The test was written.", CHARS
    ).handoff_text
    assert "NEXT: Write the test." in text
    assert "was written" not in text


def test_notes_that_copy_a_tool_output_line_or_a_carried_instruction_are_dropped() -> None:
    run = [
        Message.user("Fix the double post. Keep the ledger API stable.", pinned=True),
        *FAILING_RUN[1:],
        Message.assistant(tool_calls=[ToolCall(id="c2", name="ls", args={})]),
        Message.tool_result("c2", "6175  src/notifications/handlers_64.py\n12  README.md"),
        Message.assistant("Listed."),
    ]
    prepared = prepare_compaction(run, _config(retained=0), CHARS)
    assert prepared is not None
    reply = (
        "## Goal\n- Fix the double post.\n"
        "## Facts\n- 6175  src/notifications/handlers_64.py\n- The ledger team owns sync.py."
    )
    text = finalize_compaction(prepared.plan, reply, CHARS).handoff_text
    assert "- Fix the double post. Keep the ledger API stable." in text  # the pinned message
    assert "GOAL" not in text  # it only repeated the pinned message
    assert "handlers_64" not in text  # only what a tool printed, unremarkable
    assert "FACT: The ledger team owns sync.py." in text
