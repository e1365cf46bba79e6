"""pod_latest by last seen (pods not seen for a while leave the live fleet);
refused_selects (selects refused for their token, per claimed cluster and hour)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 11:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pod_latest") as batch:
        batch.create_index("ix_pod_latest_created_at", ["created_at"])
    op.create_table(
        "refused_selects",
        sa.Column("cluster", sa.String(length=63), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "reason", "hour"),
    )


def downgrade() -> None:
    op.drop_table("refused_selects")
    with op.batch_alter_table("pod_latest") as batch:
        batch.drop_index("ix_pod_latest_created_at")
