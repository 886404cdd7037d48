"""usage and chargeback (issue 35): the team a job's submitter was in (kept when the team is
removed), prices per node size, budgets per team

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("team", sa.String(64), nullable=True))
    op.create_table(
        "prices",
        sa.Column("size", sa.String(64), primary_key=True),
        sa.Column("per_hour", sa.Float(), nullable=False),
        sa.Column("currency", sa.String(8), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "budgets",
        sa.Column("team_id", sa.Integer(), sa.ForeignKey("teams.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("action", sa.String(8), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("budgets")
    op.drop_table("prices")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("team")
