"""person_sessions: the person's groups as the provider last said them, when that was,
and the refresh token that asks again; role and clusters become what the mapping gave
at sign-in (the mapping is applied to the groups on every request)

Create Date: 2026-12-04 21:30:00
"""

import sqlalchemy as sa
from alembic import op
from mla_switchboard.service.migrations import columns

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    with op.batch_alter_table("person_sessions") as batch:
        batch.add_column(sa.Column("groups", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("refresh_token", sa.Text(), nullable=True))
        batch.add_column(sa.Column("access_token", sa.Text(), nullable=True))
        batch.add_column(columns.timestamp("checked_at", nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("person_sessions") as batch:
        batch.drop_column("checked_at")
        batch.drop_column("access_token")
        batch.drop_column("refresh_token")
        batch.drop_column("groups")
