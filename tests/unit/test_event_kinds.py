"""Every list of event kinds is derived from ``episodic.models.EVENT_KINDS``; the one that
cannot be (schema.sql's CHECK, SQL) is compared with it here."""

from __future__ import annotations

import re
from typing import get_args

from episodic.models import CONTEXT_KINDS, EVENT_KINDS, EventKind
from episodic.store.postgres.queries import schema_sql
from episodic.store.schema import events


def test_event_kinds_are_the_literal() -> None:
    assert get_args(EventKind) == EVENT_KINDS
    assert set(EVENT_KINDS) >= CONTEXT_KINDS


def test_schema_sql_checks_the_same_kinds() -> None:
    check = re.search(r"CHECK \(\(kind = ANY \(ARRAY\[(.*?)\]\)\)\)", schema_sql(), re.DOTALL)
    assert check is not None, "schema.sql's CHECK on episodic_events.kind is not where it was"
    assert tuple(re.findall(r"'(\w+)'::text", check.group(1))) == EVENT_KINDS


def test_the_sqlite_tables_check_the_same_kinds() -> None:
    (check,) = [c for c in events.constraints if c.name == "ck_episodic_events_kind"]
    assert tuple(re.findall(r"'(\w+)'", str(getattr(check, "sqltext", "")))) == EVENT_KINDS
