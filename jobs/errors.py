"""The job system's error tree: user errors exit with code 2 and a message, never a traceback."""


class ReelbatchError(Exception):
    """Base of every error reelbatch raises on purpose; the CLI prints it and exits non-zero."""

    exit_code = 1


class UsageError(ReelbatchError):
    """The user asked for something that cannot be done as asked (bad manifest, name clash, unknown run)."""

    exit_code = 2


class RunNameTaken(UsageError):
    """A different manifest already owns this run name."""


class RunNotFound(UsageError):
    pass


class SchemaOutOfDate(ReelbatchError):
    """The database is not at the migration head and is not the embedded SQLite default."""



class NoDatabase(UsageError):
    """A command that only reads found no database where the settings point: connecting would make an empty one."""
