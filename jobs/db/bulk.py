"""Many rows into one table at once, inside the caller's transaction: what `submit` does with a large manifest.

PostgreSQL: COPY. A multi-row INSERT carries a placeholder per value, and psycopg parses every placeholder of every
statement in Python: 100,000 videos and their units were 3.4 million placeholders and most of a submit's time
(docs/SCALE.md). COPY sends the rows as data, formatted by psycopg's C code. SQLite: one prepared INSERT run by the
sqlite3 module's executemany, each value through its column type's own bind processor (what SQLAlchemy would send):
SQLAlchemy's bulk insert spent about 11 s of Python on a 100,000-video run's 200,000 rows, executemany 1.6 s.
Another database: SQLAlchemy's bulk insert.

The rows are dicts of column values; a column left out takes its Python-side default (`default=` on the mapped
column, e.g. timestamps), or its server default, or NULL, as an ORM insert would.
"""

from __future__ import annotations

import enum

from sqlalchemy import insert
from sqlalchemy.orm import Session


def insert_rows(s: Session, model, rows: list[dict]) -> None:
    if not rows:
        return
    dialect = s.get_bind().dialect
    if dialect.name not in ("postgresql", "sqlite"):
        s.execute(insert(model), rows)
        return
    table = model.__table__
    given = list(rows[0])
    defaults = {c.name: c.default for c in table.columns
                if c.name not in given and c.default is not None and not c.primary_key}
    columns = given + list(defaults)
    raw = s.connection().connection.driver_connection  # the driver's own connection, in this transaction
    if dialect.name == "sqlite":
        processors = [_processor(table.c[name], dialect) for name in given]
        # The defaults once for all the rows (one moment for their timestamps), as SQLite would store them.
        fixed = [_bound(_default(d), _processor(table.c[name], dialect)) for name, d in defaults.items()]
        plain = [p is None for p in processors]

        def values(row: dict) -> list:
            return [v if keep or v is None else p(v)
                    for v, p, keep in zip([row[name] for name in given], processors, plain)] + fixed

        marks = ", ".join("?" * len(columns))
        raw.executemany(f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({marks})", map(values, rows))
        return
    with raw.cursor() as cur, cur.copy(f"COPY {table.name} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            fixed = [_value(row[name]) for name in given]
            copy.write_row(fixed + [_default(d) for d in defaults.values()])


def _value(value):
    return value.value if isinstance(value, enum.Enum) else value


def _default(default):
    # SQLAlchemy wraps a Python default function to take an execution context, which these never read.
    return default.arg(None) if default.is_callable else default.arg


def _processor(column, dialect):
    """The column type's bind processor on `dialect` (None: the value goes as it is)."""
    return column.type.dialect_impl(dialect).bind_processor(dialect)


def _bound(value, processor):
    return value if processor is None or value is None else processor(value)
