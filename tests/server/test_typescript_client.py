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
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.test_cli import clean_env, run_cli
from tests.node import install, npx, require_node
from tests.server.live import serving

pytestmark = pytest.mark.postgres_only

PACKAGE = Path(__file__).parent / "typescript"


def test_a_generated_typescript_client(postgres_url: str, tmp_path: Path) -> None:
    node_env = require_node("run the generated TypeScript client (tests/server/typescript)")
    install(PACKAGE, node_env)

    env = clean_env(EPISODIC_DATABASE_URL=postgres_url)
    assert run_cli("migrate", cwd=tmp_path, env=env).code == 0
    created_key = run_cli("keys", "create", "--tenant", "acme", cwd=tmp_path, env=env)
    assert created_key.code == 0, created_key.output
    secret = created_key.stdout.strip()

    with serving(tmp_path, env) as server:
        base = server.base
        spec = tmp_path / "openapi.json"
        spec.write_bytes(httpx.get(f"{base}/openapi.json").raise_for_status().content)

        npx(PACKAGE, "openapi-typescript", str(spec), "-o", "schema.d.ts", env=node_env)
        npx(PACKAGE, "tsc", "--noEmit", "-p", ".", env=node_env)  # strict: the types fit
        client_env = {**node_env, "EPISODIC_URL": base, "EPISODIC_KEY": secret}
        printed = npx(PACKAGE, "tsx", "client.ts", env=client_env)
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
