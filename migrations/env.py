"""Alembic environment: the URL comes from the caller's config (the app's settings), metadata from the row modules
(jobs.db.rows and jobs.db.service_rows, on jobs.db.base's Base)."""

from alembic import context

import jobs.db.rows  # noqa: F401  (its tables onto Base.metadata)
import jobs.db.service_rows  # noqa: F401  (likewise)
from jobs.db.base import Base
from jobs.db.connect import make_engine

config = context.config


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=Base.metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        # render_as_batch: SQLite can only change tables by copying them; batch mode does that for us.
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
