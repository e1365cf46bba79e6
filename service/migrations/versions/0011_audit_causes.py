"""audit.cause: what a rollout guard's entry is about, as data (the failing pod and its
error, or the halt), so that a caller limited to some clusters reads it in its own
words instead of the note being parsed. Rows written before keep NULL: their note is
shown whole to unrestricted callers only.

Create Date: 2026-12-04 21:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.add_column(sa.Column("cause", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit") as batch:
        batch.drop_column("cause")
