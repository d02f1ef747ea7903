"""What a long use case tells its caller as it goes: a phase with no count (validating a manifest) and a count toward
a total (videos recorded, tickets queued). The default says nothing: a server's threads, a script, a test. The CLI
shows the same as a spinner and progress bars on stderr (jobs.cli.console)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Feedback:
    """Silent; subclasses show it."""

    @contextmanager
    def phase(self, text: str) -> Iterator[None]:
        yield

    @contextmanager
    def count(self, text: str, total: int) -> Iterator[Callable[[int], None]]:
        """A count toward `total`: the block calls what it is given with how many more are done."""
        yield lambda n: None


SILENT = Feedback()
