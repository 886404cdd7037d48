"""who submitted each job (round 3, teams): the user or service account's name

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("created_by", sa.String(length=128), nullable=True))
    op.create_index("ix_jobs_workspace_created_by", "jobs", ["workspace_id", "created_by"])


def downgrade() -> None:
    op.drop_index("ix_jobs_workspace_created_by", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("created_by")
