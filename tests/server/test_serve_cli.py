"""``episodic keys`` and ``episodic serve`` as a person runs them: keys made, listed and
revoked from the command line; a server that answers a key's requests, refuses a revoked
key, and exits 0 on SIGTERM after finishing."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.acceptance.test_cli import clean_env, run_cli
from tests.server.live import serving


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
