"""portal sign-ins in the database, shared by a server's processes (issue 18: --workers)

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "portal_sessions",
        sa.Column("sid_hash", sa.String(length=64), nullable=False),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("expires", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("sid_hash"),
    )
    op.create_index("ix_portal_sessions_expires", "portal_sessions", ["expires"])


def downgrade() -> None:
    op.drop_index("ix_portal_sessions_expires", table_name="portal_sessions")
    op.drop_table("portal_sessions")
