"""A conversation's head row cannot be deleted; every role may read the schema revision.

The head is the only mutable table, but only its counters and compaction state change:
deleting a head orphans the conversation's events (``load_context`` then says the
conversation does not exist while its log is still there, and re-creating the id collides
with the old events). So DELETE and TRUNCATE of head rows are refused by triggers, like the
log's, for every role including the tables' owner; removing a conversation is the erasure
path's job, which no normal role has.

``EpisodicStore.open()`` reads the revision to tell an unmigrated or outdated database from a
broken one, so the runtime roles may read ``episodic_alembic_version`` (nothing else about it).
"""

from alembic import op

revision: str = "0005_protected_heads"
down_revision: str | None = "0004_tenant_isolation"

HEADS = "episodic_conversations"
ROLES = ("episodic_app", "episodic_worker", "episodic_all_tenants")
# (Inside SQL string literals: no apostrophes.)
REFUSAL = (
    "the head row of a conversation cannot be deleted: its events would be orphaned, and the "
    "log is never rewritten"
)

REFUSE_HEAD_REMOVAL = f"""
CREATE FUNCTION episodic_refuse_head_removal() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION '%: % on % is not allowed', '{REFUSAL}', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'feature_not_supported',
              HINT = 'conversations are removed only by the erasure path of episodic';
END
$fn$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.execute(
            f"CREATE TRIGGER {HEADS}_no_delete BEFORE DELETE ON {HEADS} "
            f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}: DELETE on {HEADS} is not allowed'); END"
        )
        return
    op.execute(REFUSE_HEAD_REMOVAL)
    op.execute(
        f"CREATE TRIGGER {HEADS}_no_delete BEFORE DELETE ON {HEADS} "
        "FOR EACH ROW EXECUTE FUNCTION episodic_refuse_head_removal()"
    )
    # TRUNCATE fires no row triggers; it needs its own statement-level one.
    op.execute(
        f"CREATE TRIGGER {HEADS}_no_truncate BEFORE TRUNCATE ON {HEADS} "
        "FOR EACH STATEMENT EXECUTE FUNCTION episodic_refuse_head_removal()"
    )
    op.execute(f"GRANT SELECT ON episodic_alembic_version TO {', '.join(ROLES)}")


def downgrade() -> None:
    op.execute(f"DROP TRIGGER {HEADS}_no_delete" + ("" if _sqlite() else f" ON {HEADS}"))
    if _sqlite():
        return
    op.execute(f"DROP TRIGGER {HEADS}_no_truncate ON {HEADS}")
    op.execute("DROP FUNCTION episodic_refuse_head_removal()")
    op.execute(f"REVOKE SELECT ON episodic_alembic_version FROM {', '.join(ROLES)}")


def _sqlite() -> bool:
    return bool(op.get_bind().dialect.name == "sqlite")
