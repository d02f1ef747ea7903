"""Which database a command reads, and refusing to create one by reading it.

SQLite makes the file it is asked to open. A command that only reads (status, report, capacity, ledger,
notifications, scale) run in the wrong folder would leave an empty `reelbatch.db` behind and answer "no runs" as
though that were the truth; these read through `read_factory`, which refuses instead. `estimate` goes on without a
database (it has a forecast to give either way) by the same test, `missing_file`.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from jobs.db.connect import session_factory, snapshots
from jobs.errors import NoDatabase
from jobs.settings import Settings

DEFAULT_FILE = "reelbatch.db"  # REELBATCH_DATABASE_URL's default: this file in the current folder (jobs.settings)


def missing_file(url: str) -> Path | None:
    """The SQLite file `url` names when it does not exist (opening it would create it empty); None otherwise."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    path = Path(parsed.database)
    return None if path.exists() else path


def is_default(url: str) -> bool:
    """The database is the default one: `reelbatch.db` in the current folder."""
    parsed = make_url(url)
    return (parsed.get_backend_name() == "sqlite" and bool(parsed.database)
            and Path(parsed.database).absolute() == Path.cwd() / DEFAULT_FILE)


def shown_path(url: str) -> str:
    """The SQLite file as a reader in this folder would type it (./reelbatch.db), else the URL without password."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return parsed.render_as_string(hide_password=True)
    path = Path(parsed.database).absolute()
    return f"./{path.relative_to(Path.cwd())}" if path.is_relative_to(Path.cwd()) else str(path)


def default_note(settings: Settings) -> str | None:
    """One line saying the default database is the one read, or None when a setting chose it."""
    if not is_default(settings.database_url):
        return None
    return f"database: {shown_path(settings.database_url)} (default; set REELBATCH_DATABASE_URL to read another)"


def read_factory(settings: Settings) -> sessionmaker[Session]:
    """Sessions on the database for a command that only reads; NoDatabase (exit 2, like any setting that points
    nowhere) when it is a SQLite file that is not there, rather than creating it empty."""
    url = settings.database_url
    missing = missing_file(url)
    if missing is not None:
        which = " (the default)" if is_default(url) else ""
        raise NoDatabase(f"no database at {shown_path(url)}{which}: run this where the runs were submitted, or "
                         "set REELBATCH_DATABASE_URL to read another")
    return session_factory(url)


def snapshot_factory(settings: Settings) -> sessionmaker[Session]:
    """`read_factory`'s sessions for work that only reads: on SQLite each a snapshot that never waits for a writer
    (jobs.db.connect.snapshots), so no large submit delays a status or a report."""
    return snapshots(read_factory(settings))
