"""jobs by workspace, newest first (issue 18: one page of `job list`)

A page is ``WHERE workspace_id = ? ORDER BY id DESC LIMIT n``. On PostgreSQL the planner
took every row of the workspace through ``ix_jobs_workspace_id`` and sorted them (110 ms for
the first page at 100,000 jobs); with (workspace_id, id) it reads the page and stops.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_workspace_newest", "jobs", ["workspace_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_workspace_newest", table_name="jobs")
