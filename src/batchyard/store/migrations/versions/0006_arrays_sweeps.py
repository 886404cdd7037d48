"""job arrays, dependencies and sweeps (issue 17)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("array_name", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("depends_on", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("stop_reason", sa.Text(), nullable=True))
        batch_op.create_index("ix_jobs_array_name", ["array_name"], unique=False)
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("sealed", sa.Text(), nullable=True),
        sa.Column("source_format", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"]),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("experiment_id", "name"),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.create_index("ix_sweeps_workspace_id", ["workspace_id"], unique=False)
        batch_op.create_index("ix_sweeps_experiment_id", ["experiment_id"], unique=False)
        batch_op.create_index("ix_sweeps_cluster_id", ["cluster_id"], unique=False)
        batch_op.create_index("ix_sweeps_state", ["state"], unique=False)
    op.create_table(
        "sweep_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("raw", sa.JSON(), nullable=False),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("evaluated_step", sa.Integer(), nullable=True),
        sa.Column("stopped_by", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sweep_id", "index"),
    )
    with op.batch_alter_table("sweep_trials", schema=None) as batch_op:
        batch_op.create_index("ix_sweep_trials_sweep_id", ["sweep_id"], unique=False)
        batch_op.create_index("ix_sweep_trials_job_id", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_table("sweep_trials")
    op.drop_table("sweeps")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_array_name")
        batch_op.drop_column("stop_reason")
        batch_op.drop_column("depends_on")
        batch_op.drop_column("array_index")
        batch_op.drop_column("array_name")
