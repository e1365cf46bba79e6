"""pod_latest by last seen: pods not seen for a while leave the live fleet

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 11:00:00
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pod_latest") as batch:
        batch.create_index("ix_pod_latest_created_at", ["created_at"])


def downgrade() -> None:
    with op.batch_alter_table("pod_latest") as batch:
        batch.drop_index("ix_pod_latest_created_at")
