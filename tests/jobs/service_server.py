"""`reelbatch serve` as a user runs it, for the service's tests: a real process on a free loopback port, in a
working folder of its own (the embedded default: SQLite, the SQLite broker, a local output folder), its log kept,
and teams and tokens made by the real CLI."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_env(model_cache: Path, **more: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REELBATCH_", "AWS_"))}
    env.update(REELBATCH_CACHE_DIR=str(model_cache), PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO), **more)
    return env


class Service:
    def __init__(self, cwd: Path, env: dict, *args: str):
        # `serve` refuses to start while a team could write anywhere: the teams' default roots (the default output,
        # ./outputs/, with each team's name) lie under this, unless the test says otherwise.
        self.cwd, self.env = cwd, {"REELBATCH_ALLOWED_OUTPUTS": f"file://{cwd}/outputs/", **env}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = cwd / "serve.log"
        self.args = args
        self.cli("db", "upgrade")
        self.start()

    def start(self) -> None:
        """Start `serve` on this port (again, after a stop or a kill: its log goes on) and wait until it answers."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "jobs", "serve", "--port", str(self.port),
                                          *self.args], cwd=self.cwd, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self.url}/openapi.json", timeout=2)
                break
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"serve did not start:\n{self.log.read_text()}") from None
                time.sleep(0.2)

    def cli(self, *args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "jobs", *args], cwd=self.cwd, env=self.env, text=True,
                              capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"reelbatch {' '.join(args)}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def team(self, name: str, *options: str) -> str:
        """Add a team and make it a token; the token's secret."""
        self.cli("team", "add", name, *options)
        printed = self.cli("token", "create", "--team", name)
        (secret,) = re.findall(r"^rb_\S+$", printed, re.M)
        return secret

    def client(self, secret: str | None) -> httpx.Client:
        headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def stop(self) -> str:
        """Stop the server; its whole log."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.log.read_text(errors="replace")
