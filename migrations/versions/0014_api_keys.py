"""API keys of the HTTP server (``episodic serve``, ``episodic keys``).

``episodic_api_keys``: a key's public id, its tenant, whether it is an operator's, a label,
the SHA-256 of its secret (the secret itself is shown once and never stored), when it was
made and when revoked. The application role may read it (the server looks keys up before it
knows the tenant); creating and revoking keys is the tables' owner's.

(Frozen once it ships: the current definitions are episodic/store/sql/schema.sql and
episodic/store/schema.py.)
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0014_api_keys"
down_revision: str | None = "0013_distributable"

TABLE = "episodic_api_keys"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("secret_sha256", sa.Text(), nullable=False),
        sa.Column("operator", sa.Boolean(), nullable=False),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name="pk_episodic_api_keys"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"GRANT SELECT ON {TABLE} TO episodic_app, episodic_all_tenants")


def downgrade() -> None:
    op.drop_table(TABLE)
