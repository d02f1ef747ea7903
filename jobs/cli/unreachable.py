"""What the command line says when a setting names a database, broker or store it cannot parse or reach: one line that
names the setting, what it holds (passwords left out) and what to check, and exit 2; never a traceback.

These errors surface wherever a command first touches the server (a session's first statement, a ticket's send, an
object's read), so they are read here, once, around every command (jobs.main.main), not at each call."""

from __future__ import annotations

import os
import re

from jobs.errors import UsageError

# user:password@ in a URL: the password is never printed.
_CREDENTIALS = re.compile(r"(?<=://)([^/@:]*):[^/@]*@")


def shown_url(url: str) -> str:
    return _CREDENTIALS.sub(r"\1:***@", url)


def _setting(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return repr(shown_url(value)) if value else f"unset ({default})"


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def translate(exc: BaseException) -> UsageError | None:
    """The one-line error for a failure to parse or reach a configured server; None for any other exception."""
    import kombu.exceptions
    import sqlalchemy.exc

    database = _setting("REELBATCH_DATABASE_URL", "the SQLite file reelbatch.db in this folder")
    if isinstance(exc, sqlalchemy.exc.NoSuchModuleError) or (
            isinstance(exc, sqlalchemy.exc.ArgumentError) and "Could not parse SQLAlchemy URL" in str(exc)):
        return UsageError(f"REELBATCH_DATABASE_URL {database} is not a database URL: use sqlite:///PATH or "
                          "postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
        return UsageError(f"the database cannot be reached (REELBATCH_DATABASE_URL {database}): {_first_line(exc)}; "
                          "check the URL and that its server is running")
    if type(exc) is sqlalchemy.exc.DatabaseError:  # the exact class, not its subclasses (IntegrityError, ...)
        # SQLite's "file is not a database": the URL names a file that is something else.
        return UsageError(f"the database cannot be opened (REELBATCH_DATABASE_URL {database}): {_first_line(exc)}; "
                          "check that the URL names a reelbatch database")
    if isinstance(exc, kombu.exceptions.OperationalError):
        broker = _setting("REELBATCH_BROKER_URL", "the SQLite file reelbatch-broker.db in this folder")
        return UsageError(f"the broker cannot be reached (REELBATCH_BROKER_URL {broker}): {_first_line(exc)}; "
                          "check the URL and that its server is running")
    try:
        import botocore.exceptions
    except ImportError:  # pragma: no cover - boto3 is a dependency
        return None
    if isinstance(exc, (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
                        botocore.exceptions.NoCredentialsError, botocore.exceptions.ClientError)):
        endpoint = _setting("AWS_ENDPOINT_URL", "AWS S3")
        return UsageError(f"the store cannot be reached or refused (AWS_ENDPOINT_URL {endpoint}): {_first_line(exc)}; "
                          "check the endpoint, the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and "
                          "that the bucket exists")
    return None
