"""fair share (issue 35): the shares of each team, and of each person inside a team

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("shares", sa.Float(), nullable=False, server_default="1"))
    with op.batch_alter_table("team_members") as batch:
        batch.add_column(sa.Column("shares", sa.Float(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("team_members") as batch:
        batch.drop_column("shares")
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("shares")
