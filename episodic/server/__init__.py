"""episodic over HTTP (``episodic serve``; the ``episodic-store[server]`` extra)."""

from episodic.server.app import create_app

__all__ = ["create_app"]
