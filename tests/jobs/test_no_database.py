"""A command that only reads, run where there is no database, says so and creates none; with the default database
in this folder, `status` and `report` say which database answered (on stderr, so `--json` stays clean)."""

import json

import pytest
from typer.testing import CliRunner

from jobs.cli import app

NO_DEFAULT = ("no database at ./reelbatch.db (the default): run this where the runs were submitted, or set "
              "REELBATCH_DATABASE_URL to read another")
NOTE = "database: ./reelbatch.db (default; set REELBATCH_DATABASE_URL to read another)"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A fresh folder as the current one, with the database setting left at its default."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REELBATCH_DATABASE_URL", raising=False)
    monkeypatch.setenv("REELBATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("REELBATCH_OUTPUT", f"file://{tmp_path}/out/")
    return tmp_path


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["report", "r"], ["report", "r", "--json"],
                                  ["report", "r", "--results"], ["capacity", "--run", "r"], ["ledger"],
                                  ["notifications", "r"], ["scale"], ["cancel", "r"], ["resume", "r"],
                                  ["budget", "r", "5"]])
def test_no_database_in_this_folder_is_said_and_not_created(here, args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == NO_DEFAULT and result.stdout == ""
    assert list(here.iterdir()) == [], "nothing created"


def test_a_set_database_that_is_not_there_is_named(here, monkeypatch):
    monkeypatch.setenv("REELBATCH_DATABASE_URL", f"sqlite:///{here}/elsewhere/r.db")
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"no database at ./elsewhere/r.db: run this where the runs were submitted, or "
                                     "set REELBATCH_DATABASE_URL to read another")
    assert list(here.iterdir()) == []


def test_status_and_report_name_the_default_database(here):
    (here / "v.jsonl").write_text('{"id": "a", "prompt": "p"}\n')
    submitted = CliRunner().invoke(app, ["submit", "v.jsonl"])
    assert submitted.exit_code == 0, submitted.output
    assert (here / "reelbatch.db").exists()
    status = CliRunner().invoke(app, ["status", "--json"])
    assert status.exit_code == 0, status.output
    assert status.stderr.strip() == NOTE
    assert [r["name"] for r in json.loads(status.stdout)["runs"]] == ["v"], "stdout is the JSON alone"
    report = CliRunner().invoke(app, ["report", "v", "--json"])
    assert report.exit_code == 0, report.output
    assert report.stderr.strip() == NOTE and json.loads(report.stdout)["name"] == "v"


def test_a_database_chosen_by_the_setting_is_not_called_the_default(here, monkeypatch):
    (here / "v.jsonl").write_text('{"id": "a", "prompt": "p"}\n')
    monkeypatch.setenv("REELBATCH_DATABASE_URL", f"sqlite:///{here}/chosen.db")
    assert CliRunner().invoke(app, ["submit", "v.jsonl"]).exit_code == 0
    status = CliRunner().invoke(app, ["status"])
    assert status.exit_code == 0 and status.stderr == ""
