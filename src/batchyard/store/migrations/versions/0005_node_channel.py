"""node channel: launcher reports, join tokens, agent commands, node credentials

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_reports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "node_rank"),
    )
    with op.batch_alter_table("node_reports", schema=None) as batch_op:
        batch_op.create_index("ix_node_reports_attempt_id", ["attempt_id"], unique=False)
        batch_op.create_index("ix_node_reports_token_hash", ["token_hash"], unique=False)
    op.create_table(
        "join_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["cluster_id"], ["clusters.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    with op.batch_alter_table("join_tokens", schema=None) as batch_op:
        batch_op.create_index("ix_join_tokens_cluster_id", ["cluster_id"], unique=False)
    op.create_table(
        "node_commands",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("taken_at", sa.Float(), nullable=True),
        sa.Column("done_at", sa.Float(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("node_commands", schema=None) as batch_op:
        batch_op.create_index("ix_node_commands_node_id", ["node_id"], unique=False)
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("machine_id", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("credential_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_at", sa.Float(), nullable=True))
        batch_op.create_index("ix_nodes_credential_hash", ["credential_hash"], unique=False)
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("control", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("control_version", sa.Integer(), nullable=False,
                                      server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("control_version")
        batch_op.drop_column("control")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index("ix_nodes_credential_hash")
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("credential_hash")
        batch_op.drop_column("machine_id")
    op.drop_table("node_commands")
    op.drop_table("join_tokens")
    op.drop_table("node_reports")
