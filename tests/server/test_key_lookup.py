"""The key lookup every /v1 request makes: no cache, so a key revoked through one key store
(another server process, the CLI) is refused by every other on its next lookup; a database
that cannot be reached is an error that says so (503 over HTTP), not a driver's."""

from __future__ import annotations

import pytest

from episodic.errors import AuthenticationError, DatabaseUnavailableError
from episodic.server.keys import KeyStore


async def test_a_key_revoked_elsewhere_is_refused_on_the_next_lookup(
    keys: KeyStore, database_url: str
) -> None:
    key, secret = await keys.create("acme")
    other = KeyStore.open(database_url)  # as another process holds it
    try:
        assert (await other.verify(secret)).key_id == key.key_id
        await keys.revoke(key.key_id)
        with pytest.raises(AuthenticationError, match="was revoked"):
            await other.verify(secret)
    finally:
        await other.close()


async def test_an_unreachable_database_is_said_so() -> None:
    keys = KeyStore.open("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    try:
        with pytest.raises(DatabaseUnavailableError, match="cannot connect to"):
            await keys.verify("ep_0123_secret")
    finally:
        await keys.close()
