"""evidence_snapshot_parts: an evidence snapshot kept in parts of a few hundred KB, one
row each, so that neither writing nor reading one needs a block the size of the whole;
``evidence_snapshots.parts`` says how many a snapshot has (0: the one-payload layout of
before, still read)

Create Date: 2026-12-05 04:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    op.add_column(
        "evidence_snapshots",
        sa.Column("parts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_table(
        "evidence_snapshot_parts",
        sa.Column("snapshot_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("snapshot_id", "seq"),
    )


def downgrade() -> None:
    op.drop_table("evidence_snapshot_parts")
    with op.batch_alter_table("evidence_snapshots") as batch:
        batch.drop_column("parts")
