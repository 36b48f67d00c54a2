"""A client no one here wrote: TypeScript types generated from a live ``episodic serve``'s
/openapi.json by openapi-typescript, requests made through openapi-fetch
(tests/server/typescript/client.ts). ``tsc --noEmit`` (strict) proves the generated types
describe what the client sends and reads (a message to append has its role's rules: a tool
message without its call's id does not compile); running it proves the server answers as
they say: create, an idempotent append and its replay, the mismatch, a stale If-Match, an
append in OpenAI's chat format, the context in that format, and the typed problems of an
unknown conversation and of no key.

Needs Node 20+ and npm (the packages come from the npm registry on the first run, pinned by
package-lock.json): without them the test is skipped, or fails where
EPISODIC_TEST_REQUIRE_EXTRAS=1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.test_cli import clean_env, run_cli
from tests.server.live import serving
from tests.support import REQUIRE_EXTRAS

pytestmark = pytest.mark.postgres_only

PACKAGE = Path(__file__).parent / "typescript"
#: written by npm ci: older than package-lock.json means node_modules is out of date
INSTALLED_LOCK = PACKAGE / "node_modules" / ".package-lock.json"
#: outside the checkout and the user's own npm cache, and kept between runs
NPM_CACHE = Path(tempfile.gettempdir()) / "episodic-tests-npm-cache"
MIN_NODE = 20
NPM_CI_TIMEOUT = 300
STEP_TIMEOUT = 120


def _require_node() -> dict[str, str]:
    """The environment Node and npm run in; skip (or fail under EPISODIC_TEST_REQUIRE_EXTRAS)
    without them."""
    node, npm, npx = (shutil.which(tool) for tool in ("node", "npm", "npx"))
    problem = None
    if node is None or npm is None or npx is None:
        problem = "needs Node and npm on PATH"
    else:
        version = subprocess.run(
            [node, "--version"], capture_output=True, encoding="utf-8", timeout=30, check=False
        ).stdout.strip()
        found = re.match(r"v(\d+)\.", version)
        if found is None or int(found.group(1)) < MIN_NODE:
            problem = f"needs Node {MIN_NODE}+, not {version or 'an unknown version'}"
    if problem is not None:
        message = f"{problem} to run the generated TypeScript client (tests/server/typescript)"
        if REQUIRE_EXTRAS:
            pytest.fail(f"{message}; EPISODIC_TEST_REQUIRE_EXTRAS=1", pytrace=False)
        pytest.skip(message)
    assert node is not None
    path = os.environ.get("PATH", "")
    node_dir = str(Path(node).parent)
    return clean_env(
        PATH=path if node_dir in path.split(os.pathsep) else node_dir + os.pathsep + path,
        HOME=os.environ.get("HOME") or tempfile.gettempdir(),
        npm_config_cache=str(NPM_CACHE),
        npm_config_update_notifier="false",
        npm_config_fund="false",
        npm_config_audit="false",
        NO_COLOR="1",
    )


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _run(command: list[str], env: dict[str, str], timeout: int) -> str:
    try:
        done = subprocess.run(
            command,
            cwd=PACKAGE,
            env=env,
            capture_output=True,
            encoding="utf-8",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        output = _text(exc.stdout) + _text(exc.stderr)
        pytest.fail(f"{' '.join(command)} took over {timeout} s:\n{output}")
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n" + (
        done.stdout + done.stderr
    )
    return done.stdout


def _npx(*args: str, env: dict[str, str], timeout: int = STEP_TIMEOUT) -> str:
    """A tool of the locked packages in node_modules (--no: npx never fetches one)."""
    return _run(["npx", "--no", "--", *args], env, timeout)


def _install(env: dict[str, str]) -> None:
    """npm ci when node_modules is missing or older than package-lock.json. Install scripts
    are not run: none of the packages needs one (esbuild's binary is its platform package)."""
    lock = PACKAGE / "package-lock.json"
    if INSTALLED_LOCK.exists() and INSTALLED_LOCK.stat().st_mtime >= lock.stat().st_mtime:
        return
    _run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"], env, NPM_CI_TIMEOUT)


def test_a_generated_typescript_client(postgres_url: str, tmp_path: Path) -> None:
    node_env = _require_node()
    _install(node_env)

    env = clean_env(EPISODIC_DATABASE_URL=postgres_url)
    assert run_cli("migrate", cwd=tmp_path, env=env).code == 0
    created_key = run_cli("keys", "create", "--tenant", "acme", cwd=tmp_path, env=env)
    assert created_key.code == 0, created_key.output
    secret = created_key.stdout.strip()

    with serving(tmp_path, env) as server:
        base = server.base
        spec = tmp_path / "openapi.json"
        spec.write_bytes(httpx.get(f"{base}/openapi.json").raise_for_status().content)

        _npx("openapi-typescript", str(spec), "-o", "schema.d.ts", env=node_env)
        _npx("tsc", "--noEmit", "-p", ".", env=node_env)  # strict: the types fit our usage
        client_env = {**node_env, "EPISODIC_URL": base, "EPISODIC_KEY": secret}
        printed = _npx("tsx", "client.ts", env=client_env)
        seen: dict[str, Any] = json.loads(printed.strip().splitlines()[-1])

        # The log holds the one batch (replayed, not written twice) and the fresh append:
        # the mismatch and the stale write wrote nothing.
        events = httpx.get(
            f"{base}/v1/conversations/{seen['created']['id']}/events",
            headers={"Authorization": f"Bearer {secret}"},
        ).json()["events"]
        assert [event["seq"] for event in events] == [1, 2, 3, 4, 5]

    cid = seen["created"]["id"]
    assert seen["created"] == {
        "status": 201,
        "location": f"/v1/conversations/{cid}",
        "etag": '"0"',
        "id": cid,
    }
    assert seen["append"] == {"status": 201, "etag": '"4"', "seqs": [1, 2, 3, 4], "last_seq": 4}
    assert seen["replay"] == seen["append"]  # the first result, replayed

    mismatch = seen["mismatch"]
    assert mismatch["status"] == 422
    assert mismatch["content_type"].startswith("application/problem+json")
    assert mismatch["type"].endswith("/IdempotencyMismatchError")
    assert mismatch["title"] == "Unprocessable Entity"

    stale = seen["stale"]
    assert stale["status"] == 412
    assert stale["type"].endswith("/ConflictError")
    assert "not the expected 0" in stale["detail"]
    assert seen["fresh"] == {"status": 201, "seqs": [5]}

    context = seen["context"]
    assert (context["status"], context["format"], context["last_seq"]) == (200, "openai", 5)
    assert context["etag"] == '"5"'
    assert context["messages"] == [
        {
            "role": "user",
            "content": "What is the weather in Paris?",
            "tool_calls": [],
            "tool_call_id": None,
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": ["weather:call_1"],
            "tool_call_id": None,
        },
        {"role": "tool", "content": "18°C and sunny", "tool_calls": [], "tool_call_id": "call_1"},
        {
            "role": "assistant",
            "content": "It is 18°C and sunny in Paris.",
            "tool_calls": [],
            "tool_call_id": None,
        },
        {"role": "user", "content": "Thanks!", "tool_calls": [], "tool_call_id": None},
    ]

    not_found = seen["not_found"]
    assert not_found["status"] == 404
    assert not_found["type"].endswith("/NotFoundError")
    assert not_found["instance"].startswith("/v1/conversations/")
    assert not_found["instance"] != f"/v1/conversations/{cid}"

    no_key = seen["no_key"]
    assert no_key["status"] == 401
    assert no_key["type"].endswith("/AuthenticationError")
    assert no_key["www_authenticate"].startswith("Bearer")
