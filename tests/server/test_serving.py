"""What each ``episodic serve`` process runs: the app made from the settings at the
lifespan's startup (a failure stops the process instead of serving without it), closed at
its end; and the settings handed to the worker processes through the environment."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from episodic.server.collector import FIRST_GENERATION
from episodic.server.keys import KeyStore
from episodic.server.serving import ServedApp
from episodic.settings import EpisodicSettings, environment_of
from tests.conftest import isolated_settings


class Lifespan:
    """Drives an app's lifespan as uvicorn does, and records what it answers."""

    def __init__(self, app: ServedApp) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self.task = asyncio.create_task(self.app(scope, self.inbox.get, self.sent.put))
        await self.inbox.put({"type": "lifespan.startup"})
        async with asyncio.timeout(30):
            answer = await self.sent.get()
        return str(answer["type"])

    async def stop(self) -> str:
        await self.inbox.put({"type": "lifespan.shutdown"})
        async with asyncio.timeout(30):
            answer = await self.sent.get()
            assert self.task is not None
            await self.task
        return str(answer["type"])


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was, whatever a served app's startup set."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


async def test_a_process_makes_its_app_at_startup_and_closes_it_at_shutdown(
    database_url: str, collector: None
) -> None:
    settings = isolated_settings().model_copy(update={"database_url": database_url})
    keys = KeyStore.open(database_url)
    try:
        _, secret = await keys.create("acme")
    finally:
        await keys.close()
    app = ServedApp(settings)
    lifespan = Lifespan(app)
    assert gc.get_threshold()[0] != FIRST_GENERATION
    assert await lifespan.start() == "lifespan.startup.complete"
    # the startup's objects frozen out of later scans, the first generation's threshold raised
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == FIRST_GENERATION
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://episodic") as http:
        http.headers["Authorization"] = f"Bearer {secret}"
        assert (await http.post("/v1/conversations", json={})).status_code == 201
        assert (await http.get("/readyz")).status_code == 200
    assert await lifespan.stop() == "lifespan.shutdown.complete"


async def test_a_process_whose_app_cannot_start_says_so_and_serves_nothing(
    collector: None,
) -> None:
    settings = isolated_settings().model_copy(
        update={
            "database_url": "postgresql+asyncpg://nobody@127.0.0.1:1/none",
            "connect_timeout_seconds": 2.0,
        }
    )
    app = ServedApp(settings)
    lifespan = Lifespan(app)
    assert await lifespan.start() == "lifespan.startup.failed"
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError, match="before the app's lifespan started"):
        await app({"type": "http", "path": "/healthz"}, lifespan.inbox.get, lifespan.sent.put)


def test_the_settings_reach_the_workers_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given = EpisodicSettings(
        _env_file=None,
        database_url="postgresql+asyncpg://u:p@db:5432/e",
        server_port=9000,
        server_workers=3,
        server_max_inflight=7,
        server_queue_timeout=0.25,
        summarizer_api_key=SecretStr("sk-secret"),
        trigger_context_tokens=None,  # off: a None that is not the default
        detect_instructions=False,
    )
    variables = environment_of(given)
    assert variables["EPISODIC_SUMMARIZER_API_KEY"] == "sk-secret"
    assert variables["EPISODIC_TRIGGER_CONTEXT_TOKENS"] == "off"
    assert "EPISODIC_METRICS_PORT" not in variables  # unset stays unset
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert EpisodicSettings(_env_file=None) == given
