"""API keys: each names a tenant (and maybe an operator), is random, is shown once and kept
only as a SHA-256 of its secret (a 256-bit random secret needs no slow hash: there is nothing
to guess). A key reads ``ep_<key id>_<secret>``; the id finds the row, the hash is compared
in constant time.

Every ``/v1`` request verifies its key, so on PostgreSQL :meth:`KeyStore.verify` is one
prepared statement on a small pool of plain asyncpg connections (the store's own pool class):
94 µs where SQLAlchemy's pooled connection took 469 (``python -m bench --http``, issue 35).
Nothing is cached: a revoked key is refused by every server process on its next request.
Making, listing and revoking keys, rare and operator-driven, stay in SQLAlchemy, and so
does everything on SQLite."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
from sqlalchemy import RowMapping, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from episodic.errors import ApiKeyNotFoundError, AuthenticationError, ValidationError
from episodic.store.db_errors import translated_errors
from episodic.store.engine import parse_database_url
from episodic.store.postgres.backend import connector
from episodic.store.postgres.pool import Pool
from episodic.store.schema import api_keys

PREFIX = "ep_"
#: the one statement of a PostgreSQL key lookup (api_keys' columns, by its primary key)
KEY_ROW = (
    "SELECT key_id, tenant_id, secret_sha256, operator, label, created_at, revoked_at "
    "FROM episodic_api_keys WHERE key_id = $1"
)
#: connections of the lookup's pool: a lookup holds one for a single short round trip
LOOKUP_CONNECTIONS = 4
CONNECT_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as listed: never its secret."""

    key_id: str
    tenant_id: str
    operator: bool
    label: str | None
    created_at: datetime
    revoked_at: datetime | None


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class KeyStore:
    """The keys table of one database (its own small engine, beside the store's)."""

    def __init__(self, engine: AsyncEngine, lookups: Pool | None = None) -> None:
        self._engine = engine
        # Every request's key lookup is one statement: run it without BEGIN and ROLLBACK
        # around it (two round trips of three).
        self._reader = engine.execution_options(isolation_level="AUTOCOMMIT")
        #: PostgreSQL: the lookup's own connections (opened when first needed)
        self._lookups = lookups

    @classmethod
    def open(cls, url: str) -> KeyStore:
        parsed = parse_database_url(url)
        if parsed.dialect != "postgresql" or parsed.asyncpg is None:
            return cls(create_async_engine(parsed.sqlalchemy))
        dsn = parsed.asyncpg
        # a refused connection says what to fix (503 over HTTP), as the store's do
        connect = connector(parsed.masked, CONNECT_TIMEOUT_SECONDS)
        return cls(
            create_async_engine(parsed.sqlalchemy, pool_size=1, max_overflow=2),
            Pool(lambda: connect(dsn), min_size=0, max_size=LOOKUP_CONNECTIONS),
        )

    async def close(self) -> None:
        if self._lookups is not None:
            await self._lookups.close()
        await self._engine.dispose()

    async def create(
        self, tenant_id: str, *, operator: bool = False, label: str | None = None
    ) -> tuple[ApiKey, str]:
        """A new key and its full text (shown once: only its hash is stored)."""
        if not tenant_id or not tenant_id.strip():
            raise ValidationError("a key needs a tenant (--tenant T)", field="tenant")
        key = ApiKey(
            key_id=secrets.token_hex(8),
            tenant_id=tenant_id,
            operator=operator,
            label=label,
            created_at=datetime.now(UTC),
            revoked_at=None,
        )
        secret = secrets.token_urlsafe(32)
        with translated_errors():
            async with self._engine.begin() as connection:
                await connection.execute(
                    insert(api_keys).values(
                        key_id=key.key_id,
                        tenant_id=key.tenant_id,
                        secret_sha256=_digest(secret),
                        operator=key.operator,
                        label=key.label,
                        created_at=key.created_at,
                    )
                )
        return key, f"{PREFIX}{key.key_id}_{secret}"

    async def list(self) -> list[ApiKey]:
        with translated_errors():
            async with self._engine.connect() as connection:
                rows = await connection.execute(
                    select(api_keys).order_by(api_keys.c.created_at, api_keys.c.key_id)
                )
                return [_key(row) for row in rows.mappings()]

    async def revoke(self, key_id: str) -> ApiKey:
        """Stamp the key revoked (again: no change); unknown: :class:`ApiKeyNotFoundError`."""
        with translated_errors():
            async with self._engine.begin() as connection:
                await connection.execute(
                    update(api_keys)
                    .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                    .values(revoked_at=datetime.now(UTC))
                )
                row = (
                    (await connection.execute(select(api_keys).where(api_keys.c.key_id == key_id)))
                    .mappings()
                    .first()
                )
        if row is None:
            raise ApiKeyNotFoundError(key_id)
        return _key(row)

    async def verify(self, presented: str) -> ApiKey:
        """The live key ``presented`` is; else :class:`AuthenticationError`."""
        key_id, _, secret = presented.removeprefix(PREFIX).partition("_")
        if not presented.startswith(PREFIX) or not key_id or not secret:
            raise AuthenticationError("the API key is malformed: expected ep_<id>_<secret>")
        row = await self._row(key_id)
        if row is None or not hmac.compare_digest(row["secret_sha256"], _digest(secret)):
            raise AuthenticationError("the API key is unknown")
        if row["revoked_at"] is not None:
            raise AuthenticationError(f"the API key {key_id} was revoked")
        return _key(row)

    async def _row(self, key_id: str) -> RowMapping | asyncpg.Record | None:
        with translated_errors():
            if self._lookups is not None:
                found: asyncpg.Record | None = await self._lookups.fetchrow(KEY_ROW, key_id)
                return found
            async with self._reader.connect() as connection:
                return (
                    (await connection.execute(select(api_keys).where(api_keys.c.key_id == key_id)))
                    .mappings()
                    .first()
                )


def _key(row: RowMapping | asyncpg.Record) -> ApiKey:
    return ApiKey(
        key_id=row["key_id"],
        tenant_id=row["tenant_id"],
        operator=bool(row["operator"]),
        label=row["label"],
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
    )
