"""measurements

Create Date: 2026-11-30 07:34:02.992473
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "measurements",
        columns.serial_id(),
        columns.ulid("report_id"),
        columns.timestamp("at"),
        columns.cluster(),
        columns.node(nullable=True),
        columns.pod(nullable=False),
        sa.Column("device_name", sa.String(length=253), nullable=False),
        sa.Column("capability", sa.String(length=8), nullable=True),
        sa.Column("dims", sa.String(length=32), nullable=False),
        sa.Column("num_heads", sa.Integer(), nullable=True),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("packages", sa.Text(), nullable=False),
        columns.backend(),
        sa.Column("impl", sa.String(length=100), nullable=True),
        sa.Column("shape", sa.Text(), nullable=False),
        sa.Column("median_ms", sa.Float(), nullable=True),
        sa.Column("tflops", sa.Float(), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_measurements_at"), ["at"], unique=False)
        batch_op.create_index(batch_op.f("ix_measurements_report_id"), ["report_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_measurements_report_id"))
        batch_op.drop_index(batch_op.f("ix_measurements_at"))

    op.drop_table("measurements")
