"""evidence_snapshots: what a replica's evidence counted up to a measurement id, which
a start restores before reading only the rows after it; and an index of the wrong
results alone, which such a start reads again (they are few; an admin's clear changes
them)

Create Date: 2026-12-05 00:30:00
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    op.create_table(
        "evidence_snapshots",
        columns.serial_id(),
        columns.timestamp("made_at"),
        sa.Column("per_pod", sa.Integer(), nullable=False),
        sa.Column("measurement_id", sa.BigInteger(), nullable=False),
        sa.Column("gaps", sa.JSON(), nullable=False),
        sa.Column("pods", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_measurements_wrong_id",
        "measurements",
        ["id"],
        postgresql_where=sa.text("correct = false"),
        sqlite_where=sa.text("correct = false"),
    )


def downgrade() -> None:
    op.drop_index("ix_measurements_wrong_id", table_name="measurements")
    op.drop_table("evidence_snapshots")
