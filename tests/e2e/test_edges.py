"""Settings that name a server which cannot be parsed or reached: one line naming the setting and what to check,
exit 2, no traceback, run as a user runs `reelbatch` (a subprocess; the servers really down). A submit whose tickets
cannot be queued keeps its run, recorded in one transaction before any ticket, and says so; the run is then
rendered as soon as there is a broker."""

from __future__ import annotations

import json

from tests.e2e.conftest import DEMO, Cli
from tests.jobs.service_server import free_port


def test_a_database_url_that_is_not_one_is_one_line(cli, tmp_path):
    proc = Cli(tmp_path, {**cli.env, "REELBATCH_DATABASE_URL": "bogus"})("status", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("REELBATCH_DATABASE_URL 'bogus' is not a database URL: use sqlite:///PATH or "
                           "postgresql://USER:PASSWORD@HOST:PORT/DATABASE\n")
    assert proc.stdout == "" and not (tmp_path / "reelbatch.db").exists()


def test_a_database_that_refuses_connections_is_one_line_without_its_password(cli, tmp_path):
    port = free_port()  # nothing listens there
    url = f"postgresql+psycopg://reel:hunter2@127.0.0.1:{port}/reelbatch"
    for args in (("status",), ("report", "demo"), ("submit", str(DEMO))):
        proc = Cli(tmp_path, {**cli.env, "REELBATCH_DATABASE_URL": url})(*args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"the database cannot be reached (REELBATCH_DATABASE_URL "
                               f"'postgresql+psycopg://reel:***@127.0.0.1:{port}/reelbatch'): connection failed"), line
        assert line.endswith("; check the URL and that its server is running"), line
        assert "hunter2" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


def test_a_submit_with_the_broker_down_keeps_its_run_says_so_and_loses_nothing(cli, tmp_path):
    broker = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    proc = Cli(tmp_path, {**cli.env, "REELBATCH_BROKER_URL": broker})("submit", str(DEMO), "--json", check=False)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout)
    assert (said["created"], said["pending"], said["queued"]) == (True, 4, False)
    assert said["unqueued"].startswith("the broker cannot be reached (Error 111 connecting to 127.0.0.1:")
    (warning,) = proc.stderr.splitlines()
    assert warning.startswith(f"warning: run {said['run_id']} demo is recorded, but its work was not queued: the "
                              "broker cannot be reached (")
    assert warning.endswith("(REELBATCH_BROKER_URL). Nothing is lost: once the broker answers, the first sweep of "
                            "a worker that serves toy queues its 4 pending units.")
    assert "Traceback" not in proc.stderr
    (run,) = cli.json("status")["runs"]
    assert (run["run_id"], run["counts"]["pending"]) == (said["run_id"], 4)
    # Other commands that need the broker say which and why in one line.
    proc = Cli(tmp_path, {**cli.env, "REELBATCH_BROKER_URL": broker})("run", str(DEMO), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(f"the broker cannot be reached (REELBATCH_BROKER_URL '{broker}'): "
                                                   "Error 111 connecting to 127.0.0.1:")
    # With a broker (the embedded default), the same run renders: nothing was lost.
    cli("run", str(DEMO))
    (run,) = cli.json("status")["runs"]
    assert (run["run_id"], run["counts"]["succeeded"]) == (said["run_id"], 4)
