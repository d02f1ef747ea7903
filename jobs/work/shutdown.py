"""How a worker stops: its SIGTERM, SIGINT and SIGQUIT handlers, in place of Celery's, and, for the worker that
`reelbatch run` starts, the watch on that process.

Celery's own handlers leave the batch in hand to chance: its solo pool takes one more ticket after a warm shutdown
begins (its loop drains the broker once more in a `finally`), a second Ctrl-C is a cold shutdown that cannot stop a
task running in the main thread, and repeated SIGTERMs are ignored. These handlers make it explicit:

- the first SIGTERM or SIGINT: take no new work (a ticket still delivered goes back to the queue), finish the batch
  in hand, or with `--grace S` stop it at its next step if what is left of it cannot be done within S seconds;
- a second SIGTERM or SIGINT, or SIGQUIT: stop the batch in hand at its next step and hand its units back at once.

Either way Celery is told to shut down warm (its loop ends once the task in hand returns) and the worker exits 0.
The handlers only write the shared state (jobs.render.stopping) and Celery's flag; the message is written by a
thread of its own, since a signal handler may interrupt the very logging call it would use. A prefork worker's
children ignore SIGTERM and SIGINT (a `systemctl stop` signals every process of the unit): they read the phase the
parent's handler wrote.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

from celery.platforms import EX_OK
from celery.worker import state as celery_state

from jobs.render.stopping import Phase, Stopping, steps_file, write_steps

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
PR_SET_PDEATHSIG = 1  # linux/prctl.h

# (signal number, the phase it left) for the announcing thread; SimpleQueue.put may be called from a signal handler.
_events: queue.SimpleQueue = queue.SimpleQueue()
_config: dict = {}


def install(stopping: Stopping, *, grace_s: float | None, pool: str, notices: Path | None,
            parent_pid: int | None) -> None:
    """Take SIGTERM, SIGINT and SIGQUIT in this (the worker's main) process. Called before Celery starts and again
    when the worker is ready, after Celery has installed its own; a shutdown Celery began in between carries on."""
    first = not _config
    _config.update(stopping=stopping, grace_s=grace_s, pool=pool, notices=notices, parent_pid=parent_pid)
    if celery_state.should_stop not in (None, False) or celery_state.should_terminate not in (None, False):
        stopping.finish(grace_s)
    if notices is not None and pool == "solo":  # `reelbatch run`'s worker: its bar moves per step
        stopping.on_progress = partial(write_steps, steps_file(notices))
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    if first:
        threading.Thread(target=_announce, name="reelbatch-shutdown", daemon=True).start()


def leave_to_parent() -> None:
    """In a prefork child: the parent's handlers decide, through the shared phase."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _on_signal(signum: int, _frame) -> None:
    stopping: Stopping = _config["stopping"]
    if signum == signal.SIGQUIT or stopping.phase is not Phase.WORKING:
        stopping.stop_now()
    else:
        stopping.finish(_config["grace_s"])
    celery_state.should_stop = EX_OK  # Celery's warm shutdown: its loop ends when the task in hand returns
    _events.put((signum, stopping.phase))


def watch_parent(pid: int) -> None:
    """Stop now (SIGQUIT to this process) when process `pid`, the `reelbatch run` that started this worker, is gone,
    even if it was killed. Linux signals its death (PR_SET_PDEATHSIG); a thread that polls for a new parent covers
    other systems, and a death between the fork and the prctl."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, *(ctypes.c_ulong(a) for a in (signal.SIGQUIT, 0, 0, 0))) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d); polling for the parent instead", ctypes.get_errno())

    def poll() -> None:
        while os.getppid() == pid:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGQUIT)

    threading.Thread(target=poll, name="reelbatch-parent-watch", daemon=True).start()


def _announce() -> None:
    announced: set[Phase] = set()
    while True:
        signum, phase = _events.get()
        if phase in announced:
            continue  # a second SIGQUIT, or the parent watch after PR_SET_PDEATHSIG: said already
        name = signal.Signals(signum).name + (" again" if announced and signum != signal.SIGQUIT else "")
        announced.add(phase)
        try:
            _say(name, phase)
        except Exception:  # noqa: BLE001 - a message that cannot be written must not stop the shutdown
            log.exception("could not announce the shutdown")


def _say(name: str, phase: Phase) -> None:
    stopping: Stopping = _config["stopping"]
    grace_s, notices, parent = _config["grace_s"], _config["notices"], _config["parent_pid"]
    in_hand = stopping.describe()
    if parent is not None and os.getppid() != parent:
        name = f"{name} (the `reelbatch run` that started this worker, pid {parent}, is gone)"
    if _config["pool"] == "prefork":
        batch = "each process's batch in hand"
    else:
        batch = in_hand.text(estimate=phase is not Phase.STOPPING) if in_hand.stage != "idle" else ""
    if not batch:
        text = f"{name}: taking no new work; no batch in hand: stopping"
    elif phase is Phase.STOPPING:
        text = f"{name}: stopping {batch} at its next step and handing it back"
    elif grace_s is None:
        text = f"{name}: taking no new work; finishing {batch}; SIGTERM or Ctrl-C again stops it at its next step"
    else:
        text = (f"{name}: taking no new work; {batch}: finishing it within the {grace_s:g} s grace if it can, else "
                f"stopping it at its next step and handing it back")
    log.warning("%s", text)
    if notices is not None:
        with open(notices, "a", encoding="utf-8") as f:
            f.write(json.dumps({"signal": name, "phase": phase.name.lower(), "grace_s": grace_s,
                                "in_hand": asdict(in_hand)}) + "\n")
