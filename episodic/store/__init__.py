"""Persistence: the schema, the two backends, and :class:`EpisodicStore`."""

from episodic.store.store import DEFAULT_TENANT, EpisodicStore, parse_conversation_id

__all__ = ["DEFAULT_TENANT", "EpisodicStore", "parse_conversation_id"]
