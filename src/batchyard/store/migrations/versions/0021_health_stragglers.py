"""periodic node health checks (issue 36 §4): each node's last check, passes in a row,
recent pre-flight failures and an admin's hold; stragglers (§5): the rank of an attempt
whose steps are slowest against the gang's median

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("health", sa.JSON(), nullable=True))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("straggler", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("straggler")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("health")
