"""initial schema

Create Date: 2026-11-30 07:26:55.021471
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table("answers", *columns.content_addressed("answer"))
    op.create_table(
        "audit",
        columns.serial_id(),
        columns.timestamp("at"),
        columns.actor("actor"),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=100), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("preview", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_at"), ["at"], unique=False)

    op.create_table(
        "decisions",
        columns.ulid("id"),
        columns.timestamp("created_at"),
        columns.cluster(),
        columns.node(nullable=True),
        columns.pod(nullable=True),
        *columns.choice(),
        sa.Column("rules_revision", sa.Integer(), nullable=False),
        sa.Column("request", sa.Text(), nullable=False),
        columns.content_id("answer_id"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.create_index("ix_decisions_backend_id", ["backend", "id"], unique=False)
        batch_op.create_index("ix_decisions_cluster_id", ["cluster", "id"], unique=False)

    op.create_table(
        "failures",
        columns.serial_id(),
        columns.timestamp("at"),
        columns.ulid("decision_id"),
        columns.backend(),
        sa.Column("error", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("failures", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_failures_decision_id"), ["decision_id"], unique=False)

    op.create_table(
        "meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "overrides",
        columns.cluster(),
        sa.Column("spec", sa.JSON(), nullable=False),
        *columns.authored(),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("cluster"),
    )
    op.create_table(
        "pod_latest",
        columns.cluster(),
        columns.node(nullable=False),
        columns.pod(nullable=False),
        columns.ulid("decision_id"),
        *columns.choice(),
        columns.timestamp("created_at"),
        columns.content_id("answer_id"),
        sa.PrimaryKeyConstraint("cluster", "node", "pod"),
    )
    op.create_table(
        "rules_revisions",
        sa.Column("revision", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        *columns.authored(),
        sa.PrimaryKeyConstraint("revision"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("clusters", sa.JSON(), nullable=True),
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        *columns.authored(),
        columns.timestamp("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("tokens")
    op.drop_table("rules_revisions")
    op.drop_table("pod_latest")
    op.drop_table("overrides")
    op.drop_table("meta")
    with op.batch_alter_table("failures", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_failures_decision_id"))

    op.drop_table("failures")
    with op.batch_alter_table("decisions", schema=None) as batch_op:
        batch_op.drop_index("ix_decisions_cluster_id")
        batch_op.drop_index("ix_decisions_backend_id")

    op.drop_table("decisions")
    with op.batch_alter_table("audit", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_at"))

    op.drop_table("audit")
    op.drop_table("answers")
