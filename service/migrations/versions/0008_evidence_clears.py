"""evidence_clears: each admin clear of a situation's failures, which replicas apply
in place (before, a clear bumped ``evidence_epoch`` and every replica rebuilt all its
evidence; a replica of the code before this keeps doing that until it is upgraded)

Create Date: 2026-12-01 23:00:00
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.create_table(
        "evidence_clears",
        columns.serial_id(),
        columns.timestamp("at"),
        sa.Column("device_name", sa.String(length=253), nullable=False),
        sa.Column("capability", sa.String(length=8), nullable=False),
        sa.Column("dims", sa.String(length=32), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("packages", sa.Text(), nullable=False),
        sa.Column("engine", sa.String(length=80), nullable=False),
        columns.backend(nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("evidence_clears")
