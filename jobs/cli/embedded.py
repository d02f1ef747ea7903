"""The worker `reelbatch run` starts, shown as a progress bar, and how Ctrl-C stops it.

The worker is a `reelbatch worker --pool solo` child in a session (and process group) of its own, so a terminal's
Ctrl-C reaches `run` alone and `run` decides what the worker is told: the first SIGINT or SIGTERM is passed on as
SIGTERM (take no new work, finish the batch in hand), the second as another SIGTERM (stop the batch at its next
step and hand it back), and a third kills it (its batch comes back when its leases expire). The worker says what it
is doing in a notices file (jobs.work.shutdown), which `run` turns into one line on stderr. The worker watches `run`
too and stops at its next step when `run` is gone, even after a SIGKILL.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from jobs.cli.console import progress_text, visible
from jobs.db import queries, submission
from jobs.db.status import Status
from jobs.errors import ReelbatchError
from jobs.render.stopping import InHand, read_steps, steps_file

# How long `run` waits for the worker to say what a first Ctrl-C made it do: its signal handler runs between two
# Python bytecodes of its main thread, so within one tensor operation.
NOTICE_WAIT_S = 3.0
POLL_S = 0.5


def render(factory, submitted: submission.Submitted, console: Console, resume: str) -> int | None:
    """Start the worker and show progress until every video of the run is done. Returns None then, or the signal
    that interrupted `run`, once the worker has stopped. `resume` says how to resume the run."""
    log = tempfile.NamedTemporaryFile(prefix="reelbatch-worker-", suffix=".log", delete=False)
    notices = Path(log.name).with_suffix(".notices")
    steps = steps_file(notices)
    cmd = [sys.executable, "-m", "jobs", "worker", "--concurrency", "1", "--pool", "solo",
           "--parent-pid", str(os.getpid()), "--notices", str(notices)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    received: list[int] = []  # appended by the handler; everything else happens in the loop below
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    columns = (progress_text(), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task(visible(f"rendering {submitted.name}"), total=submitted.videos)
            handled = 0
            while True:
                while handled < len(received):
                    handled += 1
                    _pass_on(proc, handled, received[0], notices, bar.console, resume)
                (counts,) = queries.run_counts(factory, str(submitted.run_id))
                ended = sum(n for k, n in counts.counts.items() if Status(k).terminal)
                failed = counts.counts.get(Status.FAILED.value, 0)
                # Per denoising step of the batch in hand (its worker writes how far it is), failed ones named.
                bar.update(task, completed=min(submitted.videos, ended + read_steps(steps)),
                           description=visible(f"rendering {submitted.name}"
                                               + (f" ({failed} failed)" if failed else "")))
                if counts.done:
                    break
                if proc.poll() is not None:
                    if received:
                        break
                    raise ReelbatchError(f"the embedded worker exited with code {proc.returncode}; "
                                         f"its log: {log.name}\n{_tail(log.name)}")
                time.sleep(POLL_S)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the run is done (or failed): the worker is idle, or nearly
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.close()
    os.unlink(log.name)
    notices.unlink(missing_ok=True)
    steps.unlink(missing_ok=True)
    return received[0] if received else None


def _pass_on(proc: subprocess.Popen, nth: int, first: int, notices: Path, console: Console, resume: str) -> None:
    """Tell the worker about the `nth` signal `run` received, and the user what happens now."""
    name = "Ctrl-C" if first == signal.SIGINT else signal.Signals(first).name
    more = "Ctrl-C again" if first == signal.SIGINT else f"a second {name} or Ctrl-C"
    if proc.poll() is not None:
        return
    if nth == 1:
        proc.send_signal(signal.SIGTERM)
        in_hand = _notice(notices)
        if in_hand is None:
            text = f"{name}: finishing the batch in hand; {more} to stop at once; {resume}"
        elif in_hand.stage == "idle":
            text = f"{name}: no batch in hand; stopping; {resume}"
        else:
            text = f"{name}: finishing {in_hand.text()}; {more} to stop at once; {resume}"
    elif nth == 2:
        proc.send_signal(signal.SIGTERM)
        text = f"{name} again: stopping the batch in hand at its next step and handing it back; {resume}"
    else:
        proc.kill()
        text = (f"{name} a third time: the worker was killed; a batch it still held comes back when its leases "
                f"expire; {resume}")
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _notice(notices: Path) -> InHand | None:
    """What the worker said it does with the batch in hand, once it has said it."""
    deadline = time.monotonic() + NOTICE_WAIT_S
    while time.monotonic() < deadline:
        try:
            lines = notices.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        if lines:
            return InHand(**json.loads(lines[0])["in_hand"])
        time.sleep(0.05)
    return None


def resume_hint(argv: list[str], name: str) -> str:
    """How to resume this run: the same command, unless it made a new run (`--new-run`), which stays queued."""
    if "--new-run" not in argv:
        return f"`{shlex.join(['reelbatch', *argv])}` resumes"
    return f"run {name} stays queued: a `reelbatch worker` renders the rest"


def _tail(path: str, lines: int = 30) -> str:
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
