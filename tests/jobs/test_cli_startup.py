"""Commands that do not render start without torch, diffusers or Celery's worker machinery: each runs in a fresh
interpreter (as a user's shell starts it) and the modules it loaded are checked."""

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
print(json.dumps({"exit": result.exit_code, "heavy": heavy, "output": result.output[-400:]}))
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
