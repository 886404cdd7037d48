"""Alembic environment: runs on the connection batchyard hands over (see store.db.upgrade),
or on BATCHYARD_DB_URL when invoked from the alembic command line."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from batchyard.config import database_url
from batchyard.store.db import normal_url
from batchyard.store.models import Base

target_metadata = Base.metadata
config = context.config

connection = config.attributes.get("connection")
if connection is None:
    engine = create_engine(normal_url(database_url()))
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata,
                          render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
