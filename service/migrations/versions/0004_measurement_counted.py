"""measurements.counted: evidence only from pods with a decision in their cluster

Create Date: 2026-11-30 17:20:00

Reports stored before this revision are counted when the reporting pod has any
recorded decision in the cluster it reported for (the situation match that new
reports get needs the request's JSON, which SQL cannot compare portably); the rest
are kept and no longer counted (otherwise any agent token could forge measured
evidence).
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("counted", sa.Boolean(), server_default=sa.true(), nullable=False)
        )
    op.execute(
        "UPDATE measurements SET counted = EXISTS (SELECT 1 FROM decisions d "
        "WHERE d.cluster = measurements.cluster AND d.pod = measurements.pod)"
    )


def downgrade() -> None:
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_column("counted")
