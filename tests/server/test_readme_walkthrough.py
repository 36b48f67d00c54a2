"""README's "Over HTTP" walkthrough, run as written against the ``episodic serve`` it starts:
a new database migrated, a key made, a conversation created and its id captured, a user
message and the model's reply (in OpenAI's chat format) appended with their statuses and
ETags shown, the run completed, the context read, the server stopped. Only the database URL
and the port are changed, to the test's own."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.readme import README_DATABASE_URL, fenced, run_shell, section, user_environment
from tests.server.live import free_port
from tests.support import REQUIRE_EXTRAS

README_PORT = "8080"


def walkthrough() -> str:
    (shell,) = fenced(section("Over HTTP"), "bash")
    return shell


def _require_tools() -> None:
    missing = [tool for tool in ("curl", "jq") if shutil.which(tool) is None]
    if missing:
        message = f"the README's HTTP walkthrough needs {' and '.join(missing)} on PATH"
        if REQUIRE_EXTRAS:
            pytest.fail(f"{message}; EPISODIC_TEST_REQUIRE_EXTRAS=1", pytrace=False)
        pytest.skip(message)


def test_the_walkthrough_does_a_whole_turn() -> None:
    shell = walkthrough()
    assert README_DATABASE_URL in shell
    for step in (
        "episodic migrate",
        "KEY=$(episodic keys create",
        "episodic serve &",
        "ID=$(",
        "/messages?format=openai",
        "/run-completed",
        "/context?format=openai",
        "kill $SERVER",
    ):
        assert step in shell, step


async def test_the_walkthrough_runs_as_written(empty_postgres_url: str, tmp_path: Path) -> None:
    _require_tools()
    shell = walkthrough()
    assert f":{README_PORT}" in shell
    port = free_port()
    script = shell.replace(README_DATABASE_URL, empty_postgres_url).replace(
        f":{README_PORT}", f":{port}"
    )
    env = {**user_environment(), "EPISODIC_SERVER_PORT": str(port)}
    code, output = await run_shell(script, cwd=tmp_path, env=env)
    assert code == 0, output

    # What each `curl -i` comment promises: the status and the ETag.
    statuses = re.findall(r"^HTTP/1\.1 (\d+)", output, re.MULTILINE)
    etags = re.findall(r'^etag: "(\d+)"', output, re.MULTILINE | re.IGNORECASE)
    assert statuses == ["201", "201", "201"], output
    assert etags == ["1", "4", "5"], output
    promised = re.findall(r'^# HTTP/1\.1 (\d+) [^,]*, etag: "(\d+)"', shell, re.MULTILINE)
    assert promised == list(zip(statuses, etags, strict=True))

    # The last curl prints the context; the server's log lines share the output.
    start = output.rindex('{"conversation_id"')
    context, _ = json.JSONDecoder().raw_decode(output, start)
    assert context["format"] == "openai"
    assert [m["role"] for m in context["messages"]] == ["user", "assistant", "tool", "assistant"]
    # The tool call went in and came back in OpenAI's shape.
    (call,) = context["messages"][1]["tool_calls"]
    assert call["function"] == {"name": "run", "arguments": '{"cmd": "pytest"}'}
    assert context["last_seq"] == 5
