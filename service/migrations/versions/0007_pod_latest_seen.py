"""pod_latest by last seen (pods not seen for a while leave the live fleet);
refused_selects (selects refused for their token, per claimed cluster and hour)

Create Date: 2026-12-01 11:00:00
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    with op.batch_alter_table("pod_latest") as batch:
        batch.create_index("ix_pod_latest_created_at", ["created_at"])
    op.create_table(
        "refused_selects",
        columns.cluster(),
        sa.Column("reason", sa.String(length=64), nullable=False),
        columns.timestamp("hour"),
        sa.Column("count", sa.Integer(), nullable=False),
        columns.timestamp("last_at"),
        sa.PrimaryKeyConstraint("cluster", "reason", "hour"),
    )


def downgrade() -> None:
    op.drop_table("refused_selects")
    with op.batch_alter_table("pod_latest") as batch:
        batch.drop_index("ix_pod_latest_created_at")
