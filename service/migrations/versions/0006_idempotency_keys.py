"""idempotency_keys: the answers of admin writes sent with an Idempotency-Key

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:00:00

Written in the same transaction as the write it answers, so a retry after a lost
answer finds either nothing (the write did not happen) or the first answer; kept
24 hours.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("actor", sa.String(length=100), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("actor", "key"),
    )
    with op.batch_alter_table("idempotency_keys") as batch:
        batch.create_index("ix_idempotency_keys_created_at", ["created_at"])


def downgrade() -> None:
    op.drop_table("idempotency_keys")
