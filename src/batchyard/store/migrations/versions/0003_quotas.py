"""quotas per workspace and node family

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(length=64), nullable=False),
        sa.Column("vcpu_limit", sa.Integer(), nullable=True),
        sa.Column("gpu_limit", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workspace_id", "family"),
    )
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.create_index("ix_quotas_workspace_id", ["workspace_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.drop_index("ix_quotas_workspace_id")
    op.drop_table("quotas")
