"""What ``episodic serve`` runs in each server process: the app, built from the settings when
the process starts serving, with its own store, pool and key store.

With ``--workers N`` uvicorn's supervisor starts N processes on one socket, and each imports
the app from an import string (:data:`APP_FACTORY`): the settings reach them through the
environment (the command line's choices written into ``EPISODIC_*`` variables first, by
:func:`episodic.settings.environment_of`). A store is opened with ``await``, which a factory
cannot do, so the factory returns :class:`ServedApp`, which opens them at the lifespan's
startup and hands every request to the app made then."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from episodic.errors import EpisodicError
from episodic.server.app import create_app
from episodic.server.collector import settle_for_serving
from episodic.server.keys import KeyStore
from episodic.server.operations import ManualCompaction
from episodic.settings import EpisodicSettings, load_settings
from episodic.store import EpisodicStore

logger = logging.getLogger("episodic.server")
#: the import string of each worker process's app (a factory: uvicorn calls it)
APP_FACTORY = "episodic.server.serving:app_from_environment"
#: every process's log as the worker's: timestamped lines, INFO and up (uvicorn applies it
#: in each process it starts; the access log is episodic's own, as JSON)
LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "stream": "ext://sys.stderr",
        }
    },
    "root": {"handlers": ["stderr"], "level": "INFO"},
}


def fastest(module: str, fallback: str) -> str:
    """``module`` (uvicorn's name for uvloop or httptools) when it is installed, else
    ``fallback``: the server extra installs both, where they build."""
    return module if importlib.util.find_spec(module) is not None else fallback


def app_from_environment() -> ServedApp:
    """The app of one worker process, from the ``EPISODIC_*`` environment (uvicorn's
    ``factory=True`` calls it in each process)."""
    return ServedApp(load_settings())


class ServedApp:
    """The served app of one process: made at the lifespan's startup, closed at its end."""

    def __init__(self, settings: EpisodicSettings) -> None:
        self.settings = settings
        self._app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is not None:
            await self._app(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
        else:  # uvicorn starts the lifespan before it takes a connection
            raise RuntimeError("a request arrived before the app's lifespan started")

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        startup = await receive()
        try:
            app = await build_app(self.settings)
        except Exception as exc:  # the process must not serve without its app
            # an episodic error says what to fix; anything else is a bug: its traceback
            logger.error(
                "the app did not start: %s", exc, exc_info=not isinstance(exc, EpisodicError)
            )
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        self._app = app
        replayed = False

        async def startup_then_the_rest() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return startup
            return await receive()

        async def settled_when_started(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                settle_for_serving()
            await send(message)

        # the app's own lifespan runs as if it had seen the startup: it closes the store
        await app(scope, startup_then_the_rest, settled_when_started)


async def build_app(settings: EpisodicSettings) -> ASGIApp:
    """The app ``settings`` describe, on a store and key store of its own (closed when its
    lifespan ends)."""
    store = await EpisodicStore.open(settings.database_url, settings=settings)
    return create_app(
        store,
        KeyStore.open(settings.database_url),
        max_body_bytes=settings.server_max_body_bytes,
        compaction=ManualCompaction.from_settings(settings),
        cors_origins=settings.cors_origins(),
        max_inflight=settings.max_inflight(),
        queue_timeout=settings.server_queue_timeout,
        close_on_shutdown=True,
    )


__all__ = ["APP_FACTORY", "LOG_CONFIG", "ServedApp", "app_from_environment", "build_app"]
