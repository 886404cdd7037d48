"""single sign-ons in progress (issue 32: OpenID Connect's device and code flows)

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sso_requests",
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("nonce", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires", sa.Float(), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=True),
        sa.Column("interval", sa.Float(), nullable=False),
        sa.Column("next_poll", sa.Float(), nullable=False),
        sa.Column("binding", sa.String(length=64), nullable=True),
        sa.Column("redirect_uri", sa.Text(), nullable=True),
        sa.Column("next_url", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("key_hash"),
    )
    op.create_index("ix_sso_requests_expires", "sso_requests", ["expires"])


def downgrade() -> None:
    op.drop_index("ix_sso_requests_expires", table_name="sso_requests")
    op.drop_table("sso_requests")
