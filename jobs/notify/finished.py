"""The one place that notices a run has finished: every video done (succeeded, failed or cancelled), however that
came about. It writes the run's result files and, for a run with `notify`, opens its notification and makes the
first attempt at once.

Callers: the worker after recording a batch (jobs.render.batch), `reelbatch cancel` (a run whose videos were all
waiting is finished by the cancel itself), and every sweeper tick through `catch_up`, which finds finishes nobody
noticed (a reaped lease that failed a run's last video, a process that died between recording and opening). A budget
or deadline that stops a run should, once its videos are marked, call `run_finished` with the run's name as cancel
does. Several callers at once are harmless: the result files are replaced whole with the same content, and the
notification's unique (run, round) lets one of them open it.

Whoever records a run's last video calls this after its own commit, so at least one caller sees every video done:
of two workers finishing the last two videos at once, the later to commit sees the other's commit.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from jobs.db import queries
from jobs.db.base import utcnow
from jobs.db.queries import Factory
from jobs.notify import outbox, payload, send
from jobs.reports.results import write_results
from jobs.settings import Settings

log = logging.getLogger(__name__)


def run_finished(settings: Settings, factory: Factory, runs: Iterable[str]) -> list[str]:
    """For each named run that has finished: its result files, then its notification (opened and tried once).
    Returns the names of those that had finished."""
    done = []
    for name in sorted(set(runs)):
        if not queries.run_finished(factory, name):  # one index probe: every worker asks after every batch
            continue
        done.append(name)
        try:
            uris = write_results(factory, name)
        except Exception as exc:  # noqa: BLE001 - the videos are recorded; the sweeper's catch_up tries again
            log.warning("could not write the result files of run %s: %s", name, exc)
            continue
        run, videos = queries.load_report(factory, name)
        if run.notify_url is None:
            continue
        key, now = str(uuid.uuid4()), utcnow()
        opened = outbox.open_notification(factory, run, key, payload.body(key, run, videos, uris, now), now)
        if opened is not None:
            log.info("run %s finished: notification %s opened", name, key)
            send.deliver_due(settings, factory, only=opened)
    return done


def catch_up(settings: Settings, factory: Factory) -> list[str]:
    """Open the notifications of finished runs that nobody opened (see the module's docstring)."""
    return run_finished(settings, factory, outbox.finished_unopened(factory))
