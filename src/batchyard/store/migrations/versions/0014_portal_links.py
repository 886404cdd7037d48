"""one-time portal sign-in links (issue 33: `batchyard portal --open`)

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "portal_links",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("next_url", sa.String(length=2048), nullable=False),
        sa.Column("expires", sa.Float(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("home_token", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.PrimaryKeyConstraint("token_hash"),
    )
    op.create_index("ix_portal_links_expires", "portal_links", ["expires"])


def downgrade() -> None:
    op.drop_index("ix_portal_links_expires", table_name="portal_links")
    op.drop_table("portal_links")
