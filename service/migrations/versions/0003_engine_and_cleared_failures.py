"""measurements per engine; failures an admin can clear

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 17:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(
            sa.Column("engine", sa.String(length=80), nullable=False, server_default="switchboard")
        )
        batch.add_column(sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("failures") as batch:
        batch.add_column(sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("failures") as batch:
        batch.drop_column("cleared_at")
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("cleared_at")
        batch.drop_column("engine")
