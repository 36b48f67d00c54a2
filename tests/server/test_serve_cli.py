"""``episodic keys`` and ``episodic serve`` as a person runs them: keys made, listed and
revoked from the command line; a server that answers a key's requests, refuses a revoked
key, and exits 0 on SIGTERM after finishing; the same with two worker processes, each of
which refuses a key from the moment it is revoked."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tests.acceptance.test_cli import clean_env, run_cli
from tests.server.live import STARTUP_SECONDS, Served, serving


def test_keys_and_serve(database_url: str, tmp_path: Path) -> None:
    env = clean_env(EPISODIC_DATABASE_URL=database_url)
    assert run_cli("migrate", cwd=tmp_path, env=env).code == 0
    created = run_cli("keys", "create", "--tenant", "acme", "--label", "ci", cwd=tmp_path, env=env)
    assert created.code == 0, created.output
    secret = created.stdout.strip()
    assert secret.startswith("ep_")
    key_id = secret.split("_")[1]
    assert "shown once" in created.stderr
    listed = run_cli("keys", "list", cwd=tmp_path, env=env)
    assert key_id in listed.stdout
    assert secret.split("_", 2)[2] not in listed.stdout  # never the secret
    unknown = run_cli("keys", "revoke", "nope", cwd=tmp_path, env=env)
    assert unknown.code == 1
    assert unknown.stderr.startswith("error: no API key has the id 'nope'")
    assert "Traceback" not in unknown.output

    with serving(tmp_path, env) as server:
        base = server.base
        headers = {"Authorization": f"Bearer {secret}"}
        created_conversation = httpx.post(f"{base}/v1/conversations", json={}, headers=headers)
        assert created_conversation.status_code == 201
        assert httpx.get(f"{base}/readyz").status_code == 200
        assert run_cli("keys", "revoke", key_id, cwd=tmp_path, env=env).code == 0
        assert httpx.get(f"{base}/v1/conversations", headers=headers).status_code == 401
    assert "Application shutdown complete" in server.output


def _answers_by_process(served: Served, status: int) -> set[int]:
    """The processes whose access log says they answered a /v1 request with ``status``."""
    pids: set[int] = set()
    for line in served.log.read_text(encoding="utf-8").splitlines():
        start = line.find("{")
        if " episodic.access " in line and start >= 0:
            record = json.loads(line[start:])
            if record["status"] == status and record["path"].startswith("/v1/"):
                pids.add(record["pid"])
    return pids


def _on_fresh_connections(served: Served, secret: str, count: int) -> list[int]:
    """``count`` requests, each on a new connection (so the workers take turns accepting)."""
    headers = {"Authorization": f"Bearer {secret}"}
    return [
        httpx.get(f"{served.base}/v1/conversations", headers=headers).status_code
        for _ in range(count)
    ]


def test_two_workers_serve_one_port_and_both_refuse_a_revoked_key_at_once(
    postgres_url: str, tmp_path: Path
) -> None:
    env = clean_env(EPISODIC_DATABASE_URL=postgres_url)
    created = run_cli("keys", "create", "--tenant", "acme", cwd=tmp_path, env=env)
    assert created.code == 0, created.output
    secret = created.stdout.strip()
    key_id = secret.split("_")[1]

    with serving(tmp_path, env, ["--workers", "2"]) as server:
        # both processes answer: requests on new connections until each has served one
        deadline = time.monotonic() + STARTUP_SECONDS
        while len(_answers_by_process(server, 200)) < 2:
            assert set(_on_fresh_connections(server, secret, 10)) == {200}
            assert time.monotonic() < deadline, "one worker never answered"
        assert run_cli("keys", "revoke", key_id, cwd=tmp_path, env=env).code == 0
        # no cache anywhere: every request after the revocation is refused, by each process
        assert set(_on_fresh_connections(server, secret, 40)) == {401}
        refused_by = _answers_by_process(server, 401)
        while len(refused_by) < 2:
            assert set(_on_fresh_connections(server, secret, 10)) == {401}
            refused_by = _answers_by_process(server, 401)
            assert time.monotonic() < deadline, "one worker was never asked after the revocation"
    assert server.output.count("Application shutdown complete") == 2
    assert "Stopping parent process" in server.output
