"""observability (issue 38): a job's MLflow params and state, a workspace's external MLflow
server, the latest usage sample an agent reported of its machine

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("params", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("mlflow", sa.JSON(), nullable=True))
    with op.batch_alter_table("workspaces") as batch:
        batch.add_column(sa.Column("mlflow_uri", sa.Text(), nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("usage", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("usage")
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_column("mlflow_uri")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("mlflow")
        batch.drop_column("params")
