"""datastores; job secrets and storage keys sealed at rest

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datastores",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("sealed", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workspace_id", "name"),
    )
    with op.batch_alter_table("datastores", schema=None) as batch_op:
        batch_op.create_index("ix_datastores_workspace_id", ["workspace_id"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sealed", sa.Text(), nullable=True))
    _seal_existing()


def _seal_existing() -> None:
    """Jobs stored before 0004 kept secrets and account keys in clear: seal them now."""
    from batchyard.storage.secrets import seal_spec

    conn = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("spec", sa.JSON),
                    sa.column("sealed", sa.Text))
    for row in conn.execute(sa.select(jobs.c.id, jobs.c.spec)).fetchall():
        spec = row.spec if isinstance(row.spec, dict) else json.loads(row.spec)
        masked, sealed = seal_spec(spec)
        if sealed:
            conn.execute(jobs.update().where(jobs.c.id == row.id)
                         .values(spec=masked, sealed=sealed))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("sealed")
    with op.batch_alter_table("datastores", schema=None) as batch_op:
        batch_op.drop_index("ix_datastores_workspace_id")
    op.drop_table("datastores")
