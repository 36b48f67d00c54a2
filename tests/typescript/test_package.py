"""The TypeScript package (clients/typescript) against a live ``episodic serve`` on
PostgreSQL: its generated types current with the server's /openapi.json, its Node test suite
(node --test: every route, every typed error, the retries through a connection-cutting
proxy, the framework sessions with the worker compacting in between), and ``npm pack``
building a package whose types compile under ``tsc --strict`` in a fresh project.

Needs Node 20+ and npm (the packages come from the npm registry, pinned by
package-lock.json): without them the tests are skipped, or fail where
EPISODIC_TEST_REQUIRE_EXTRAS=1."""

from __future__ import annotations

import inspect
import json
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from episodic import errors
from episodic.integrations.openai_agents import session_conversation_id
from tests.acceptance.test_cli import EPISODIC, clean_env, run_cli
from tests.node import install, npx, require_node, run
from tests.server.live import Served, serving
from tests.support import TerminalSummary

pytestmark = pytest.mark.postgres_only

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "typescript"
SCHEMA = PACKAGE / "src" / "schema.ts"
#: the store's message limit in these tests, small enough for a test to pass it
MAX_MESSAGE_BYTES = 16_384
WHAT = "test the TypeScript package (clients/typescript)"


@dataclass
class Live:
    served: Served
    node_env: dict[str, str]
    key: str
    operator_key: str


@pytest.fixture(scope="module")
def node_env() -> dict[str, str]:
    env = require_node(WHAT)
    install(PACKAGE, env)
    return env


@pytest.fixture
def live(postgres_url: str, tmp_path: Path, node_env: dict[str, str]) -> Iterator[Live]:
    env = clean_env(
        EPISODIC_DATABASE_URL=postgres_url,
        EPISODIC_MAX_MESSAGE_BYTES=str(MAX_MESSAGE_BYTES),
    )
    assert run_cli("migrate", cwd=tmp_path, env=env).code == 0
    keys = []
    for extra in ((), ("--operator",)):
        made = run_cli("keys", "create", "--tenant", "acme", *extra, cwd=tmp_path, env=env)
        assert made.code == 0, made.output
        keys.append(made.stdout.strip())
    with serving(tmp_path, env) as served, working(tmp_path, env):
        yield Live(served, node_env, keys[0], keys[1])


@contextmanager
def working(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """``episodic worker`` beside the server, compacting what falls due (the framework tests
    wait for its boundaries); stopped with SIGTERM, and it must exit 0."""
    with (cwd / "worker.log").open("w", encoding="utf-8") as sink:
        process = subprocess.Popen(
            [str(EPISODIC), "worker"], cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0, (cwd / "worker.log").read_text(encoding="utf-8")


def _generated(live: Live, spec: Path, out: Path) -> str:
    npx(PACKAGE, "openapi-typescript", str(spec), "-o", str(out), env=live.node_env)
    return out.read_text(encoding="utf-8")


def _spec(live: Live, tmp_path: Path) -> Path:
    spec = tmp_path / "openapi.json"
    spec.write_bytes(httpx.get(f"{live.served.base}/openapi.json").raise_for_status().content)
    return spec


def test_the_generated_types_are_current(live: Live, tmp_path: Path) -> None:
    """src/schema.ts is what openapi-typescript makes of this server's /openapi.json; a
    server schema change that was not regenerated fails here (regenerate with
    ``EPISODIC_OPENAPI=http://127.0.0.1:8000/openapi.json npm run generate``)."""
    fresh = _generated(live, _spec(live, tmp_path), tmp_path / "schema.ts")
    assert fresh == SCHEMA.read_text(encoding="utf-8"), (
        "clients/typescript/src/schema.ts is not current with the server's /openapi.json: "
        "run `npm run generate` in clients/typescript against a server of this checkout"
    )


def test_the_drift_check_sees_a_schema_change(live: Live, tmp_path: Path) -> None:
    """The check above can fail: the same comparison, on the server's document with one
    field added to a response model, differs from the checked-in types."""
    spec = _spec(live, tmp_path)
    document = json.loads(spec.read_text(encoding="utf-8"))
    document["components"]["schemas"]["Appended"]["properties"]["added_field"] = {"type": "string"}
    spec.write_text(json.dumps(document), encoding="utf-8")
    changed = _generated(live, spec, tmp_path / "schema.ts")
    assert changed != SCHEMA.read_text(encoding="utf-8")
    assert "added_field" in changed


def _error_parents() -> dict[str, str | None]:
    """Each class of episodic.errors and the episodic error it derives from (None for
    EpisodicError): the TypeScript classes must have the same names and parents."""
    parents: dict[str, str | None] = {}
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if not issubclass(cls, errors.EpisodicError) or cls.__module__ != errors.__name__:
            continue
        base = next((b for b in cls.__bases__ if issubclass(b, errors.EpisodicError)), None)
        parents[name] = base.__name__ if base is not None else None
    return parents


def _counts(output: str) -> dict[str, int]:
    """node --test's summary lines (``ℹ tests 30``, ``ℹ pass 30``, ...)."""
    return {
        name: int(value)
        for name, value in re.findall(
            r"^ℹ (tests|suites|pass|fail|cancelled|skipped|todo) (\d+)$", output, re.M
        )
    }


def test_the_node_test_suite(live: Live, request: pytest.FixtureRequest) -> None:
    env = {
        **live.node_env,
        "EPISODIC_URL": live.served.base,
        "EPISODIC_KEY": live.key,
        "EPISODIC_OPERATOR_KEY": live.operator_key,
        "EPISODIC_TEST_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
        "EPISODIC_ERROR_PARENTS": json.dumps(_error_parents()),
        "EPISODIC_SESSION_IDS": json.dumps(
            [
                [tenant, session, str(session_conversation_id(session, tenant))]
                for tenant, session in (("acme", "refunds"), ("default", "chat-1"), ("t", "ünï 🧪"))
            ]
        ),
    }
    done = run(["npm", "test", "--silent"], PACKAGE, env, check=False)
    output = done.stdout + done.stderr
    counts = _counts(output)
    summary = ", ".join(f"{name} {value}" for name, value in counts.items())
    request.config.pluginmanager.register(
        TerminalSummary("clients/typescript: node --test against episodic serve", [summary])
    )
    assert done.returncode == 0, output
    assert counts.get("fail") == 0, output
    assert counts.get("pass", 0) >= 20, output


def test_npm_pack_makes_a_package_that_compiles_in_a_fresh_project(
    node_env: dict[str, str], tmp_path: Path
) -> None:
    packed = run(["npm", "pack", "--pack-destination", str(tmp_path), "--json"], PACKAGE, node_env)
    tarball = tmp_path / json.loads(packed.stdout)[0]["filename"]
    files = {entry["path"] for entry in json.loads(packed.stdout)[0]["files"]}
    assert {"dist/index.js", "dist/index.d.ts"} <= files, files
    assert not any(path.startswith(("src/", "test/", "dist-test/")) for path in files), files

    project = tmp_path / "consumer"
    project.mkdir()
    (project / "package.json").write_text(
        json.dumps({"name": "consumer", "private": True, "type": "module"}), encoding="utf-8"
    )
    # typescript, the Node types and the frameworks at the package's own locked versions,
    # as a user would install them beside it
    lock = json.loads((PACKAGE / "package-lock.json").read_text(encoding="utf-8"))
    versions = {
        name: lock["packages"][f"node_modules/{name}"]["version"]
        for name in (
            "typescript",
            "@types/node",
            "@openai/agents-core",
            "ai",
            "zod",
            "@anthropic-ai/claude-agent-sdk",
        )
    }
    run(
        [
            "npm",
            "install",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            # the Claude Agent SDK's optional CLI binaries: not for compiling against it
            "--omit=optional",
            str(tarball),
            *(f"{name}@{version}" for name, version in versions.items()),
        ],
        project,
        node_env,
    )
    (project / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "target": "ES2022",
                    "module": "NodeNext",
                    "moduleResolution": "NodeNext",
                    "strict": True,
                    "noEmit": True,
                    "types": ["node"],
                    # the frameworks' own declarations are theirs to check
                    "skipLibCheck": True,
                },
                "include": ["index.ts"],
            }
        ),
        encoding="utf-8",
    )
    (project / "index.ts").write_text(
        """import { ConflictError, EpisodicClient, type LoadedContext } from "episodic-client";
import { EpisodicChat } from "episodic-client/ai-sdk";
import { EpisodicSessionStore } from "episodic-client/claude-agent-sdk";
import { EpisodicSession } from "episodic-client/openai-agents";
import type { SessionStore } from "@anthropic-ai/claude-agent-sdk";
import type { Session } from "@openai/agents-core";
import type { ModelMessage } from "ai";

const client = new EpisodicClient({ baseUrl: "http://127.0.0.1:8000", apiKey: "ep_key" });
export const session: Session = new EpisodicSession({ client, sessionId: "chat-1" });
const chat = new EpisodicChat({ client, conversationId: "00000000-0000-4000-8000-000000000000" });
export const history: Promise<ModelMessage[]> = chat.messages();
export const store: SessionStore = new EpisodicSessionStore({ client });

export async function turn(id: string): Promise<LoadedContext<"openai">> {
  try {
    await client.append(id, [{ role: "user", content: "hello" }], { ifMatch: true });
  } catch (error) {
    if (!(error instanceof ConflictError)) throw error;
  }
  return client.loadContext(id, { format: "openai" });
}
""",
        encoding="utf-8",
    )
    run(["npx", "--no", "--", "tsc", "-p", "."], project, node_env)
    # and one that misuses the types does not compile: the check means something
    (project / "index.ts").write_text(
        """import { EpisodicClient } from "episodic-client";
const client = new EpisodicClient({ baseUrl: "x", apiKey: "y" });
await client.append("id", [{ role: "tool", content: "a result without its call id" }]);
""",
        encoding="utf-8",
    )
    refused = run(["npx", "--no", "--", "tsc", "-p", "."], project, node_env, check=False)
    assert refused.returncode != 0
    assert "error TS" in refused.stdout, refused.stdout
