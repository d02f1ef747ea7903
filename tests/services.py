"""Start and stop the real servers the tests talk to: moto's S3 server, PostgreSQL and Redis, on loopback only.

Each `start_*` returns a running `Service` (or raises `MissingBinary`); `Service.stop()` ends it and removes its
files. tests/conftest.py turns these into session fixtures.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0


class MissingBinary(Exception):
    """A server program is not installed; `hint` says how to install it."""

    def __init__(self, binary: str, hint: str) -> None:
        super().__init__(f"{binary} not found; install it with: {hint}")
        self.binary = binary
        self.hint = hint


@dataclass
class Service:
    name: str
    url: str
    workdir: Path
    proc: subprocess.Popen | None = None  # None when the server daemonizes (PostgreSQL via pg_ctl)
    stop_command: list[str] | None = None
    stopped: bool = field(default=False, repr=False)
    # For outages in the middle of a test (halt/start/restart), set by start_*: how to launch the server again
    # (`argv` for a server this module runs as a child; `start_command` for one that daemonizes), how to bring it
    # down without deleting its files, its log, and how to tell that it is ready.
    argv: list[str] | None = field(default=None, repr=False)
    start_command: list[str] | None = field(default=None, repr=False)
    halt_command: list[str] | None = field(default=None, repr=False)
    log: Path | None = field(default=None, repr=False)
    ready: Callable[[], bool] | None = field(default=None, repr=False)

    def halt(self) -> None:
        """Stop the server but keep its files and its port, so `start()` brings it back with the same data."""
        if self.halt_command:
            _run(self.halt_command, self.workdir, self.log)
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def start(self) -> None:
        """Start a halted server again on the same port and wait until it answers."""
        if self.start_command:
            _run(self.start_command, self.workdir, self.log)
        elif self.argv:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        else:
            raise RuntimeError(f"{self.name} cannot be started again")
        _wait_until(self, self.ready, self.log)

    def restart(self) -> None:
        self.halt()
        self.start()

    def stop(self) -> None:
        """End the server and delete its files; safe to call twice."""
        if self.stopped:
            return
        self.stopped = True
        try:
            if self.stop_command:
                subprocess.run(self.stop_command, cwd=self.workdir, capture_output=True, timeout=30)
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass(frozen=True)
class S3Server:
    """What the tests need to reach moto: its address. Credentials can be anything; moto does not check them."""

    endpoint_url: str


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; a race with another process is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start_moto() -> Service:
    """moto's standalone S3-protocol server, run by this venv's interpreter; clients reach it over HTTP only."""
    # moto's server needs its [server] extra (flask); look for both without paying for importing them here.
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        raise MissingBinary("moto.server", "the test extra: pip install -e '.[test]'")
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="reelbatch-moto-"))
    log = open(workdir / "moto.log", "wb")
    argv = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    log.close()
    service = Service("moto", f"http://{HOST}:{port}", workdir, proc=proc, argv=argv, log=workdir / "moto.log")
    service.ready = lambda: _http_ok(service.url)
    _wait_until(service, service.ready, service.log)
    return service


def start_redis() -> Service:
    binary = shutil.which("redis-server")
    if binary is None:
        raise MissingBinary("redis-server", "apt-get install redis-server")
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="reelbatch-redis-"))
    log = open(workdir / "redis.log", "wb")
    # No persistence: the tests want a clean, fast broker, and nothing should be written outside workdir.
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
    log.close()
    service = Service("redis", f"redis://{HOST}:{port}/0", workdir, proc=proc)
    _wait_until(service, lambda: _redis_pong(port), workdir / "redis.log")
    return service


def start_postgres() -> Service:
    """A throwaway cluster: trust auth on loopback, its socket in a private folder, fsync off (test data only)."""
    bindir = _postgres_bindir()
    as_root = os.geteuid() == 0
    # initdb and postgres refuse to run as root, so as root run them as the `postgres` user via runuser.
    prefix: list[str] = []
    if as_root:
        runuser = shutil.which("runuser")
        if runuser is None:
            raise MissingBinary("runuser", "apt-get install util-linux")
        prefix = [runuser, "-u", "postgres", "--"]
    port = free_port()
    # Our own folder under the system temp dir, not pytest's tmp_path: that one is mode 0700 under root's name,
    # so the postgres user could not reach into it.
    workdir = Path(tempfile.mkdtemp(prefix="reelbatch-pg-"))
    data, sockdir = workdir / "data", workdir / "sock"
    sockdir.mkdir()
    if as_root:
        for path in (workdir, sockdir):
            shutil.chown(path, "postgres", "postgres")
    log = workdir / "postgres.log"
    service = Service("postgres", f"postgresql+psycopg://postgres@{HOST}:{port}/postgres", workdir, log=log)
    service.ready = lambda: _postgres_ready(service.url)
    try:
        _run(
            prefix
            + [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]
            + ["--locale=C", "--no-sync"],
            workdir,
            log,
        )
        pg_ctl = prefix + [str(bindir / "pg_ctl"), "-D", str(data)]
        options = f"-k {sockdir} -p {port} -h {HOST} -c fsync=off"
        service.start_command = pg_ctl + ["-l", str(log), "-w", "-t", str(int(START_TIMEOUT_S)), "-o", options, "start"]
        _run(service.start_command, workdir, log)
        service.stop_command = pg_ctl + ["stop", "-m", "immediate"]
        # A fast shutdown, as an operator's restart does: open sessions are ended, clients see their connections drop.
        service.halt_command = pg_ctl + ["stop", "-m", "fast", "-w"]
        _wait_until(service, service.ready, log)
    except BaseException:
        service.stop()
        raise
    return service


def libpq_url(url: str) -> str:
    """`postgresql+psycopg://...` (SQLAlchemy's spelling) -> `postgresql://...` (what psycopg.connect takes)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _postgres_bindir() -> Path:
    # Debian keeps the server programs off PATH, one folder per major version; take the newest.
    candidates = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    candidates.sort(key=lambda path: int(path.split("/")[4]) if path.split("/")[4].isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    raise MissingBinary("initdb/pg_ctl", "apt-get install postgresql")


def _run(command: list[str], cwd: Path, log: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise RuntimeError(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}\n{tail}"
        )


def _wait_until(service: Service, ready: Callable[[], bool], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if service.proc is not None and service.proc.poll() is not None:
            break
        if ready():
            return
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    service.stop()
    raise RuntimeError(f"{service.name} did not become ready at {service.url}; log tail:\n{tail}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _redis_pong(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _postgres_ready(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(libpq_url(url), connect_timeout=1) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False
