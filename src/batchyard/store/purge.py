"""Deleting rows with everything that hangs off them, found from the schema itself.

Deleting a workspace (or an experiment) deleted its jobs one by one but not their attempts, and
the foreign key refused the commit: an ``IntegrityError`` (a 500) for any workspace that ever
ran a job. Listing the child tables by hand is how that happened, and every table added later
(sweeps, idempotency keys, datastores...) would need the list mended again. So the rows to go
are found by walking the foreign keys of the models' metadata: every row whose required
(non-null) foreign key points at a row that goes, goes too; a nullable one is set to NULL (a
node of a kept cluster that still names a deleted job). Events name their entity by kind and
id, with no foreign key: they go with their entity. A table keyed by its foreign keys (a
team's guarantee on a cluster) that no other table refers to goes by those keys."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Column, Table, delete, select, update
from sqlalchemy.orm import Session

from batchyard.store.models import Base

CHUNK = 500  # ids per IN (...)
EVENT_KINDS = {"job": "jobs", "cluster": "clusters", "node": "nodes", "sweep": "sweeps",
               "workspace": "workspaces", "experiment": "experiments"}


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    ordered = sorted(ids)
    for start in range(0, len(ordered), CHUNK):
        yield ordered[start:start + CHUNK]


Link = tuple[Table, Column[Any], str]  # (table, its column, the parent table it names)


def _referred(table: Table) -> bool:
    return any(fk.column.table is table for other in Base.metadata.tables.values()
               for fk in other.foreign_keys)


def doomed_rows(session: Session, root: Table, ids: Iterable[int]
                ) -> tuple[dict[str, set[int]], list[Link], list[Link]]:
    """(table name -> primary keys that go, [links] to set to NULL where they name a row
    that goes, [links] of tables with a composite key whose rows naming one go by it)."""
    doomed: dict[str, set[int]] = {root.name: set(ids)}
    nulls: list[Link] = []
    by_link: list[Link] = []
    for table in Base.metadata.sorted_tables:  # parents before children
        if table is root:
            continue
        keys = list(table.primary_key.columns)
        for fk in table.foreign_keys:
            parent = fk.column.table.name
            if not doomed.get(parent):
                continue
            if fk.parent.nullable:
                nulls.append((table, fk.parent, parent))
                continue
            if len(keys) != 1:  # a child nothing else can refer to: deleted by the link
                if _referred(table):
                    raise RuntimeError(f"purge: {table.name} has a composite primary key "
                                       "and rows of other tables refer to it")
                by_link.append((table, fk.parent, parent))
                continue
            found = doomed.setdefault(table.name, set())
            for chunk in _chunks(doomed[parent]):
                found.update(session.scalars(select(keys[0]).where(fk.parent.in_(chunk))))
    return doomed, nulls, by_link


def purge(session: Session, root: Table, ids: Iterable[int]) -> dict[str, int]:
    """Delete the rows ``ids`` of ``root`` and every row that depends on them; the number
    of rows that went, per table."""
    session.flush()
    doomed, nulls, by_link = doomed_rows(session, root, ids)
    for table, column, parent in nulls:
        for chunk in _chunks(doomed[parent]):
            session.execute(update(table).where(column.in_(chunk)).values({column.name: None}))
    gone: dict[str, int] = {}
    for table, column, parent in by_link:
        for chunk in _chunks(doomed[parent]):
            went = session.execute(delete(table).where(column.in_(chunk)))
            gone[table.name] = gone.get(table.name, 0) + int(getattr(went, "rowcount", 0) or 0)
    events = Base.metadata.tables["events"]
    for kind, name in EVENT_KINDS.items():
        for chunk in _chunks(doomed.get(name, ())):
            session.execute(delete(events).where(events.c.kind == kind,
                                                 events.c.entity_id.in_(chunk)))
    for table in reversed(Base.metadata.sorted_tables):  # children before parents
        ids_of = doomed.get(table.name)
        if not ids_of:
            continue
        key = next(iter(table.primary_key.columns))
        for chunk in _chunks(ids_of):
            session.execute(delete(table).where(key.in_(chunk)))
        gone[table.name] = len(ids_of)
    session.expire_all()
    return gone


def forget_orphan_events(session: Session) -> None:
    """Delete the events whose entity no longer exists (a node scaled down, a job deleted
    before its workspace)."""
    tables = Base.metadata.tables
    events = tables["events"]
    for kind, name in EVENT_KINDS.items():
        key = next(iter(tables[name].primary_key.columns))
        session.execute(delete(events).where(events.c.kind == kind,
                                             events.c.entity_id.not_in(select(key))))
