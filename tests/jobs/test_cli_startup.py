"""Commands that do not render start without torch, diffusers or Celery's worker machinery, and without what only
some commands use (PyAV, botocore's client side, alembic's migration scripts): each runs in a fresh interpreter (as a
user's shell starts it) and the modules it loaded are checked."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

# Each command runs through the real CLI against a real SQLite database holding one submitted run.
LIGHT = [
    ["--help"],
    ["status"],
    ["status", "demo", "--json"],
    ["report", "demo"],
    ["ledger"],
    ["schedule", "list"],
    ["settings"],
    ["models"],
    ["models", "--json"],
    ["cancel", "demo"],
    ["notifications", "demo"],
    ["resume", "demo"],
    ["submit", "manifests/examples/demo.yaml"],
    ["estimate", "manifests/examples/demo.yaml", "--gpus", "2"],
    ["budget", "demo", "5"],
]

PROBE = """
import json, sys
from typer.testing import CliRunner
from jobs.cli import app
result = CliRunner().invoke(app, sys.argv[1:])
heavy = [m for m in ("torch", "diffusers", "transformers") if m in sys.modules]
# Imported where used (storage.poster, storage.s3, jobs.db.connect): 0.1-0.2 s of start-up each (docs/PERFORMANCE.md).
# botocore.config pulls in urllib3 and the HTTP side; botocore.exceptions alone is light (jobs.work.schedules uses it).
later = [m for m in ("av", "boto3", "botocore.config", "urllib3", "alembic") if m in sys.modules]
print(json.dumps({"exit": result.exit_code, "heavy": heavy, "later": later, "output": result.output[-400:]}))
"""


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with its own SQLite database and broker file, where `demo` has been submitted once."""
    folder = tmp_path_factory.mktemp("startup")
    proc = subprocess.run([sys.executable, "-m", "jobs", "submit", str(REPO / "manifests/examples/demo.yaml")],
                          cwd=folder, env=_env(folder), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return folder


def _env(folder):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")}
    return {**env, "REELBATCH_CACHE_DIR": str(folder / "cache"), "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("args", LIGHT, ids=" ".join)
def test_a_command_that_does_not_render_never_imports_torch(workdir, args):
    args = [str(REPO / a) if a.endswith(".yaml") else a for a in args]
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=workdir, env=_env(workdir),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["exit"] == 0, found["output"]
    assert found["heavy"] == [], f"{' '.join(args)} imported {found['heavy']}"
    assert found["later"] == [], f"{' '.join(args)} imported {found['later']}"


def test_the_schema_check_finds_alembics_head_without_alembic():
    """Every command checks the schema (jobs.db.connect.session_factory) by reading the migrations' revision lines;
    alembic, reading the same scripts its own way, must name the same head."""
    from alembic.script import ScriptDirectory

    from jobs.db.connect import alembic_config, script_head

    assert script_head() == ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def _migration(folder, name, revision, down):
    (folder / f"{name}.py").write_text(f'"""{name}."""\nfrom alembic import op\n\nrevision = {revision}\n'
                                       f"down_revision: str | None = {down}\n\n\ndef upgrade():\n    pass\n")


def test_the_schema_check_leaves_anything_but_one_plain_head_to_alembic(tmp_path):
    from jobs.db.connect import script_head

    (tmp_path / "__init__.py").write_text("")
    _migration(tmp_path, "0001_a", "'a'", "None")
    _migration(tmp_path, "0002_b", "'b'", "'a'")
    assert script_head(tmp_path) == "b"
    branched = tmp_path / "branched"
    branched.mkdir()
    _migration(branched, "0001_a", "'a'", "None")
    _migration(branched, "0002_b", "'b'", "'a'")
    _migration(branched, "0002_c", "'c'", "'a'")
    assert script_head(branched) is None  # two heads: alembic says what to do
    merged = tmp_path / "merged"  # (script_head keeps its answer for a folder: the process's migrations never change)
    merged.mkdir()
    for name, revision, down in (("0001_a", "'a'", "None"), ("0002_b", "'b'", "'a'"), ("0002_c", "'c'", "'a'"),
                                 ("0003_d", "'d'", "('b', 'c')")):
        _migration(merged, name, revision, down)
    assert script_head(merged) == "d"
    unread = tmp_path / "unread"
    unread.mkdir()
    _migration(unread, "0001_a", "'a'", "None")
    _migration(unread, "0002_b", "REVISION", "'a'")  # not a literal
    assert script_head(unread) is None
