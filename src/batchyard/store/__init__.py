"""Persistent state: SQLAlchemy 2 models, engine/session set-up and Alembic migrations."""
