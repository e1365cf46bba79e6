"""idempotency_keys: the answers of admin writes sent with an Idempotency-Key

Create Date: 2026-12-01 10:00:00

Written in the same transaction as the write it answers, so a retry after a lost
answer finds either nothing (the write did not happen) or the first answer; kept
24 hours.
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        columns.actor("actor"),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        columns.timestamp("created_at"),
        sa.PrimaryKeyConstraint("actor", "key"),
    )
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.create_index("ix_idempotency_keys_created_at", ["created_at"])


def downgrade() -> None:
    op.drop_table("idempotency_keys")
