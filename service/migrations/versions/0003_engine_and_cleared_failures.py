"""measurements per engine; failures an admin can clear

Create Date: 2026-11-30 17:20:00
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(
            sa.Column("engine", sa.String(length=80), nullable=False, server_default="switchboard")
        )
        batch.add_column(columns.timestamp("cleared_at", nullable=True))
    with op.batch_alter_table("failures") as batch:
        batch.add_column(columns.timestamp("cleared_at", nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("failures") as batch:
        batch.drop_column("cleared_at")
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("cleared_at")
        batch.drop_column("engine")
