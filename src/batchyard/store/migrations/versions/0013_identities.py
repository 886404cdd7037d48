"""people and what they may do (issue 32): users, personal tokens, teams, roles per
workspace, the audit trail; who made each sweep; who signed in to each portal session

Portal sessions made before this revision were signed in with the home's token and say so
nowhere: they are ended (their browsers sign in again).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("email", sa.String(length=255), nullable=True),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("service", sa.Boolean(), nullable=False),
        sa.Column("disabled_at", sa.Float(), nullable=True),
        sa.Column("issuer", sa.String(length=255), nullable=True),
        sa.Column("subject", sa.String(length=255), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
        sa.UniqueConstraint("issuer", "subject"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_index("ix_api_tokens_user_id", "api_tokens", ["user_id"])
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "team_members",
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("team_id", "user_id"),
    )
    op.create_index("ix_team_members_user_id", "team_members", ["user_id"])
    op.create_table(
        "role_assignments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("team_id", sa.Integer(), nullable=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["workspace_id"], ["workspaces.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("workspace_id", "holder"),
    )
    op.create_index("ix_role_assignments_workspace_id", "role_assignments", ["workspace_id"])
    op.create_index("ix_role_assignments_holder", "role_assignments", ["holder"])
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("credential", sa.String(length=32), nullable=True),
        sa.Column("action", sa.String(length=48), nullable=False),
        sa.Column("target", sa.Text(), nullable=True),
        sa.Column("workspace", sa.String(length=64), nullable=True),
        sa.Column("client", sa.String(length=64), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_log_ts", "audit_log", ["ts"])
    op.create_index("ix_audit_log_actor_ts", "audit_log", ["actor", "ts"])
    op.create_index("ix_audit_log_workspace_ts", "audit_log", ["workspace", "ts"])
    op.create_index("ix_audit_log_client_ts", "audit_log", ["client", "ts"])
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("created_by", sa.String(length=128), nullable=True))
    op.execute("DELETE FROM portal_sessions")
    with op.batch_alter_table("portal_sessions") as batch:
        batch.add_column(sa.Column("user_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("home_token", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))


def downgrade() -> None:
    op.execute("DELETE FROM portal_sessions")
    with op.batch_alter_table("portal_sessions") as batch:
        batch.drop_column("home_token")
        batch.drop_column("user_id")
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("created_by")
    for index in ("ix_audit_log_client_ts", "ix_audit_log_workspace_ts",
                  "ix_audit_log_actor_ts", "ix_audit_log_ts"):
        op.drop_index(index, table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_index("ix_role_assignments_holder", table_name="role_assignments")
    op.drop_index("ix_role_assignments_workspace_id", table_name="role_assignments")
    op.drop_table("role_assignments")
    op.drop_index("ix_team_members_user_id", table_name="team_members")
    op.drop_table("team_members")
    op.drop_table("teams")
    op.drop_index("ix_api_tokens_user_id", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("users")
