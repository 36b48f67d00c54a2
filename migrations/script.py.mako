"""${message}

(Frozen once it ships: a later change is a new revision. A function this revision creates is
a copy of episodic/store/postgres/schema.sql at this revision, and schema.sql stays the current
definition; tests/contract/test_schema.py compares them.)
"""

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}

revision: str = ${repr(up_revision)}
down_revision: str | None = ${repr(down_revision)}


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
