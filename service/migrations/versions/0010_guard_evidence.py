"""decisions.principal and decisions.verified: who asked for each decision (a verified
pod's ``workload:<uid>`` or a static token's id), so that the rollout guards count a
report as evidence from its asker rather than from a pod name in a request body. Rows
written before keep NULL (no asker known) and ``verified`` false. guard_pending: the
reports whose rollout guard has not run yet, shared by every replica, so that no
replica's step overtakes a halt another replica could not evaluate.

Create Date: 2026-12-02 21:00:00
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("principal", sa.String(length=80), nullable=True))
        batch.add_column(
            sa.Column("verified", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    op.create_table(
        "guard_pending",
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        columns.timestamp("created_at"),
        sa.PrimaryKeyConstraint("key"),
    )


def downgrade() -> None:
    op.drop_table("guard_pending")
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("verified")
        batch.drop_column("principal")
