"""the servers of a database (where launchers find the one leading now) and when each node
launcher was last heard from (a server taking over notices the silent ones) (issue 33)

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "servers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("url", sa.String(length=512), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("leading", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("url"),
    )
    with op.batch_alter_table("node_reports") as batch:
        batch.add_column(sa.Column("heard_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("node_reports") as batch:
        batch.drop_column("heard_at")
    op.drop_table("servers")
