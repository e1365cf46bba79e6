"""person_sessions: people signed in through the OIDC provider, one row per session
(the SHA-256 of the cookie's id, never the id), read by every replica

Create Date: 2026-12-02 21:00:00
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "person_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("subject", sa.String(length=255), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("clusters", sa.JSON(), nullable=True),
        columns.timestamp("created_at"),
        columns.timestamp("expires_at"),
        sa.PrimaryKeyConstraint("id_hash"),
    )
    op.create_index("ix_person_sessions_expires_at", "person_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_person_sessions_expires_at", table_name="person_sessions")
    op.drop_table("person_sessions")
