"""Real processes and real network faults for end-to-end tests: `reelbatch worker` processes the test can kill,
freeze and thaw, a TCP gate that takes a server off the network and brings it back, and polling.

Every worker runs in its own process group (a prefork worker's children too), so a signal to the group reaches all
of it, and `Workers` kills every group it started when the test ends, whatever happened.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

HOST = "127.0.0.1"


def wait_for(what: str, check: Callable[[], object], timeout: float, interval: float = 0.25,
             diagnose: Callable[[], str] | None = None):
    """Poll `check` until it returns something truthy, and return that. An exception in `check` (a database that is
    restarting) counts as "not yet". Fails with `what` and `diagnose()` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - polled through an outage on purpose
            last_error = exc
        if time.monotonic() > deadline:
            detail = diagnose() if diagnose else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                                 f" (last error: {last_error!r})\n{detail}")
        time.sleep(interval)


class Worker:
    """One `reelbatch worker` process (and, with prefork, its children) in a process group of its own."""

    def __init__(self, name: str, env: dict, cwd: Path, log: Path, pool: str = "solo", args: tuple[str, ...] = ()):
        self.name, self.log, self.pool = name, log, pool
        cmd = [sys.executable, "-m", "jobs", "worker", "--pool", pool, "--concurrency", "1", *args]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid

    def __repr__(self) -> str:
        return f"Worker({self.name}, pid {self.pid}, {self.pool})"

    def owns(self, lease_owner: str | None) -> bool:
        """Is `lease_owner` (`hostname:pid`, written by jobs.observe.identity.worker_id) this worker or one of its
        children?"""
        if not lease_owner:
            return False
        pid = int(lease_owner.rsplit(":", 1)[1])
        try:
            return pid == self.pid or os.getpgid(pid) == self.pid
        except ProcessLookupError:
            return False

    def signal(self, sig: int) -> None:
        """Send `sig` to the whole process group."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)  # also ends a stopped (SIGSTOP) group
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tasks_done(self) -> int:
        """Render tickets this worker has finished: Celery logs one line per ticket when it ends, however it ends."""
        text = self.text()
        return sum(text.count(s) for s in ("] succeeded in ", "] raised unexpected", "] retry: "))

    def claims(self) -> int:
        """Batches this worker has claimed: jobs.render.batch logs one "claimed N (SHAPE)" line per claim (and later
        "claimed N: ..." lines saying what it stored, not counted here)."""
        return len(re.findall(r"\] claimed \d+ \(", self.text()))

    def mid_render(self) -> bool:
        """Is the task of this worker's latest claim still running (rendering)? With overlap, a rendered batch is
        stored after its task returns, its units still running: a worker frozen then has no ticket left to end."""
        return self.claims() == len(re.findall(r"succeeded in .*'claimed [1-9]", self.text())) + 1

    def tail(self, lines: int = 40) -> str:
        return f"--- {self!r} log tail ---\n" + "\n".join(self.text().splitlines()[-lines:])


class Workers:
    """Start workers; on exit, kill every process group started, whatever state it is in (even stopped)."""

    def __init__(self, env: dict, cwd: Path):
        self.env, self.cwd = env, cwd
        self.all: list[Worker] = []

    def start(self, pool: str = "solo", args: tuple[str, ...] = (), env: dict | None = None) -> Worker:
        """A worker with `args` for `reelbatch worker` and `env` over the shared environment."""
        name = f"w{len(self.all)}"
        worker = Worker(name, {**self.env, **(env or {})}, self.cwd, self.cwd / f"worker-{name}.log", pool, args)
        self.all.append(worker)
        return worker

    def holding(self, lease_owner: str | None) -> Worker | None:
        return next((w for w in self.all if w.owns(lease_owner)), None)

    def tails(self) -> str:
        return "\n".join(w.tail() for w in self.all)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.all:
            worker.kill()


class TcpGate:
    """A TCP forwarder from a loopback port to a server, that the test can shut like a network outage.

    `close()` stops listening (new connections are refused, as by a server that is down) and resets every open
    connection; `open()` listens again on the same port. The server behind it keeps running, so its state survives.
    """

    def __init__(self, target_port: int):
        self.target = (HOST, target_port)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.open()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def open(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        listener.settimeout(0.1)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            _reset(conn)

    def _accept_loop(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            _reset(src)
            _reset(dst)


def _reset(sock: socket.socket) -> None:
    """Close with an RST, as a dead peer's kernel would, instead of an orderly FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
