"""guaranteed capacity (issue 35 §2): teams' guarantees per cluster, and the team whose
guarantee a running job borrows

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "guarantees",
        sa.Column("cluster_id", sa.Integer(),
                  sa.ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("team_id", sa.Integer(), sa.ForeignKey("teams.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("nodes", sa.Integer(), nullable=False),
        sa.Column("borrow_limit", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("borrowed_from", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("borrowed_from")
    op.drop_table("guarantees")
