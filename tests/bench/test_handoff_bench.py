"""The handoff benchmark's machinery, end to end, with a scripted model (never the real one):
the sessions and their probes, the scoring on known answers, every compactor's adapter
against an OpenAI-compatible server on 127.0.0.1, and the report.

The scripted model answers a summarization request with the prompt's lines that hold a
digit (so some facts pass a handoff and some do not), and the probes' questions by reading
the conversation it was given: every answer is the whole conversation on one line, and the
planned-not-done question is answered "no" when the conversation says the item is not done
yet. So its answer recall must equal context recall, a check that the questions, the
parsing and the scoring line up.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.handoff.__main__ import main
from bench.handoff.compactors import COMPACTORS, load
from bench.handoff.compactors.base import count_tokens, keep_from
from bench.handoff.scoring import holds, parse_answers, questions_prompt, render, says_yes, score
from bench.handoff.sessions import PROBE_KINDS, SESSION_KINDS, generate
from episodic.worklog import WORKLOG_HEADER
from tests.support_openai import FakeOpenAIServer, Reply, chat_completion

_QUESTION = re.compile(r"^(\d+)\. (.*)$", re.MULTILINE)


class ScriptedModel(FakeOpenAIServer):
    """Answers from the request: a summary of the prompt's lines with digits, or the probes'
    answers read off the conversation."""

    def _next_reply(self) -> Reply:
        request = self.requests[-1].json or {}
        prompt = "\n".join(_text(m.get("content")) for m in request.get("messages", []))
        if "<conversation>" in prompt:
            return Reply(200, chat_completion(_answers(prompt)))
        lines = [line for line in prompt.splitlines() if re.search(r"\d", line)]
        return Reply(200, chat_completion("Handoff notes:\n" + "\n".join(lines)[-1500:]))


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _answers(prompt: str) -> str:
    conversation = prompt.split("<conversation>", 1)[1].split("</conversation>", 1)[0]
    # and what a search found, where the prompt gives it
    found = prompt.partition("<search results>")[2].partition("</search results>")[0]
    flat = " ".join(conversation.split() + found.split())
    out = []
    for number, question in _QUESTION.findall(prompt.split("<conversation>", 1)[0]):
        if "Answer yes or no" in question:
            said = "no" if re.search(r"not (written|issued) yet", flat) else "yes"
        else:
            said = flat
        out.append(f"{number}. {said}")
    return "\n".join(out)


# ---- the sessions and the scoring ------------------------------------------------------------


@pytest.mark.parametrize("kind", SESSION_KINDS)
def test_a_session_plants_every_probe_kind_and_each_seed_is_its_own(kind: str) -> None:
    session = generate(kind, 7, 5)
    assert [p.kind for p in session.probes] == list(PROBE_KINDS)
    assert generate(kind, 7, 5) == session
    assert generate(kind, 8, 5) != session
    for seed in range(1, 41):
        session = generate(kind, seed, 9)
        whole = render([m for phase in session.phases for m in phase])
        for probe in session.probes:
            assert holds(whole, probe.keys), (seed, probe)
        # the identifier is seen only in a tool's output
        (identifier,) = (p.keys for p in session.probes if p.kind == "tool_identifier")
        said = [m for phase in session.phases for m in phase if holds(render([m]), identifier)]
        assert [m.role for m in said] == ["tool"], seed
        # early facts survive only through handoffs: no side task repeats one
        later = render([m for phase in session.phases[2:] for m in phase])
        for probe in session.probes:
            if probe.kind != "planned_not_done":
                assert not holds(later, probe.keys), (seed, probe)


def test_the_scoring_on_known_answers() -> None:
    session = generate("coding", 3, 3)
    context = render([m for phase in session.phases for m in phase])
    keys = {p.kind: p.keys for p in session.probes}
    reply = "\n".join(
        [
            f"1. {keys['constraint'][0]}",
            "2. unknown",
            f"3) {keys['file_touched'][0]}",
            "4. " + " because ".join(keys["decision"]),
            "5. unknown",
            "6. Yes, it was written.",
            f"7. `{keys['repro_command'][0]}`",
            f"8. {keys['updated_value'][0]}",
        ]
    )
    answers = parse_answers(reply, len(session.probes))
    scores = {s.kind: s for s in score(session.probes, context, answers)}
    assert all(s.in_context for s in scores.values())
    answered = {kind for kind, s in scores.items() if s.answered}
    assert answered == {"constraint", "file_touched", "decision", "repro_command", "updated_value"}
    assert scores["planned_not_done"].false_done
    assert not score(session.probes, "", ["no"] * 8)[5].false_done
    # unnumbered, one line a question: read in order
    assert parse_answers("unknown\nyes\n", 3) == ["unknown", "yes", ""]
    assert says_yes("No, not yet.") is False
    assert says_yes("unknown") is None
    # a reply that repeats the question is read after it
    asked = "Has the test test_x been written yet? Answer yes or no."
    assert says_yes("Has the test test_x been written yet? Yes", asked) is True
    assert says_yes("Has the test test_x been written yet? No.", asked) is False
    # a key matches whole words only
    assert not holds("deploy to staging-17", ("staging-7",))
    assert questions_prompt(context, session.probes).count("\n8. ") == 1
    # the derived record claims planned work only when it names it; no record, no claim
    planned = keys["planned_not_done"][0]
    assert scores["planned_not_done"].record_claims_done is None
    handoff = f"{WORKLOG_HEADER}\nFiles:\n- tests/{planned}.py: edit_file -> ok\n\nNEXT: {planned}"
    assert score(session.probes, handoff, ["no"] * 8)[5].record_claims_done
    honest = f"{WORKLOG_HEADER}\nFiles:\n- src/app.py: edit_file -> ok\n\nNEXT: {planned}"
    assert score(session.probes, honest, ["no"] * 8)[5].record_claims_done is False


def test_the_newest_messages_kept_stay_in_budget_and_keep_no_result_without_its_call() -> None:
    session = generate("coding", 3, 2)
    messages = list(session.phases[0])
    # phase 0 opens with a user message, a test run's call and its long output
    assert [m.role for m in messages[:3]] == ["user", "assistant", "tool"]
    whole = sum(count_tokens([message]) for message in messages)
    for budget in range(0, whole + 40, 10):
        start = keep_from(messages, budget)
        kept = messages[start:]
        assert kept, "the newest message is always kept"
        assert kept[0].role != "tool", budget
        size = sum(count_tokens([message]) for message in kept)
        assert len(kept) == 1 or size <= budget, budget
    assert keep_from(messages, whole) == 0


# ---- end to end ----------------------------------------------------------------------------


async def test_the_benchmark_end_to_end(tmp_path: Path) -> None:
    output = tmp_path / "HANDOFF.md"
    names = [*COMPACTORS, "keep_all", "keep_nothing"]
    async with ScriptedModel() as model:
        args = ["--endpoint", model.base_url, "--model", "scripted", "--replicates", "2"]
        args += ["--depths", "1", "2", "--output", str(output), "--compactors", *names]
        import asyncio

        code = await asyncio.to_thread(main, args)
    assert code == 0
    raw = json.loads(output.with_suffix(".json").read_text())
    assert raw["failures"] == []
    missing = {name: reason for name, reason in raw["skipped"].items()}
    for name in COMPACTORS:
        assert isinstance(load(name), type), f"{name} cannot be imported: {missing.get(name)}"
    measured: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for m in raw["measurements"]:
        measured.setdefault((m["compactor"], m["depth"]), []).append(m)
    # both session kinds, two replicates each, every compactor at both depths
    assert {key: len(ms) for key, ms in measured.items()} == {
        (name, depth): 4 for name in names for depth in (1, 2)
    }
    for ms in measured.values():
        for m in ms:
            for s in m["scores"]:
                if s["kind"] != "planned_not_done":
                    assert s["answered"] == s["in_context"], (m["compactor"], s)
    # episodic keeps a searchable log, the peers do not; an answer known without the
    # search results is known with them
    for (name, _), ms in measured.items():
        scores = [s for m in ms for s in m["scores"]]
        if name == "episodic":
            assert all(s["searched"] is not None for s in scores)
            assert sum(s["searched"] for s in scores) > len(scores) // 2
            assert all(s["answered_with_search"] or not s["answered"] for s in scores)
        else:
            assert all(s["searched"] is None for s in scores), name
    for depth in (1, 2):
        assert all(s["in_context"] for m in measured[("keep_all", depth)] for s in m["scores"])
        assert not any(
            s["in_context"] for m in measured[("keep_nothing", depth)] for s in m["scores"]
        )
    # what the model was asked: handoffs of handoffs (the second compaction summarizes
    # the first one's handoff, in episodic's worker)
    summaries = [r for r in model.requests if "<conversation>" not in json.dumps(r.json)]
    assert any("Handoff notes:" in json.dumps(r.json) for r in summaries)
    report = output.read_text()
    for name in names:
        assert f"| {name} | 1 |" in report
        assert f"| {name} | 2 |" in report
    assert "## Depth 2, by probe kind" in report
    assert "Search recall@5 % (one of the five events" in report
    # where each kind is lost: among the compactors with a model only, a row a probe kind
    lost = report.split("## Where each probe kind is lost, at depth 2", 1)[1].split("##")[0]
    rows = [
        line for line in lost.splitlines() if line.startswith("| ") and "kept least" not in line
    ]
    assert len(rows) == len(PROBE_KINDS)
    assert not any(f"| {name} |" in lost for name in ("truncation", "masking", "keep_all"))
    assert "responses.compact" in report
    # the report again from the JSON alone: the same tables
    output.write_text("")
    assert main(["--render-only", "--output", str(output)]) == 0
    assert output.read_text() == report


def test_the_runtime_is_built_for_the_instruction_sets_the_cpu_has() -> None:
    from bench.handoff.model import BASE_CMAKE_ARGS, cmake_args

    assert cmake_args("flags\t\t: fpu sse avx avx2 fma") == BASE_CMAKE_ARGS
    avx512 = cmake_args("processor : 0\nflags : fpu avx2 avx512f avx512_vnni avx512bw\n")
    assert avx512.startswith(BASE_CMAKE_ARGS)
    assert "-DGGML_AVX512=ON" in avx512
    assert "-DGGML_AVX512_VNNI=ON" in avx512
    assert "-DGGML_AVX512_BF16=ON" not in avx512
    # the AVX-512 extensions are not used without AVX-512 itself
    assert cmake_args("flags : avx2 avx512_vnni") == BASE_CMAKE_ARGS


async def test_the_model_answers_only_at_the_depths_asked(tmp_path: Path) -> None:
    import asyncio

    output = tmp_path / "HANDOFF.md"
    async with ScriptedModel() as model:
        args = ["--endpoint", model.base_url, "--model", "scripted", "--kinds", "coding"]
        args += ["--replicates", "1", "--depths", "1", "2", "--answer-depths", "2"]
        args += ["--compactors", "keep_all", "--output", str(output)]
        assert await asyncio.to_thread(main, args) == 0
        asked = [r for r in model.requests if "<conversation>" in json.dumps(r.json)]
    assert len(asked) == 1
    raw = json.loads(output.with_suffix(".json").read_text())
    by_depth = {m["depth"]: m for m in raw["measurements"]}
    assert (by_depth[1]["asked"], by_depth[1]["reply"]) == (False, "")
    assert by_depth[2]["asked"]
    report = output.read_text()
    # context recall at both depths; answer recall and false done only where asked
    assert "| keep_all | 1 | 100 ± 0 | – | – |" in report
    assert "| keep_all | 2 | 100 ± 0 | 100 ± 0 | 0 of 1 |" in report


def test_search_recall_is_measured_without_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.handoff.search_recall import main as search_recall

    assert search_recall(["--seeds", "2"]) == 0
    table = capsys.readouterr().out
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"| coding", "| support", "| all"}
    # each kind's 2 sessions plant 8 probes; the standing rule is said in so many words
    assert rows["| coding"].endswith("/16 |")
    assert rows["| all"].split(" | ")[1] == "4/4"  # constraint
    assert rows["| all"].endswith("/32 |")
