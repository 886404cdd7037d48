"""metrics: values logged by jobs (run.log, batchyard.log_metric)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 20:15:45.786173

Job tags need no column: they live in the job's spec (``spec["tags"]``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("batch_id", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.create_index("ix_metrics_job_batch", ["job_id", "batch_id"], unique=False)
        batch_op.create_index("ix_metrics_job_name", ["job_id", "name"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_metrics_job_name")
        batch_op.drop_index("ix_metrics_job_batch")
    op.drop_table("metrics")
