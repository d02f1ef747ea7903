import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The fault tests' shared checks (check_exactly_once) assert there: rewritten like a test module's, so a failure
# shows its values.
pytest.register_assert_rewrite("tests.e2e.farm")

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "manifests" / "examples" / "demo.yaml"


def base_env(model_cache) -> dict:
    """The embedded default (SQLite, the SQLite broker, a local output folder) in whatever folder the CLI runs in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REELBATCH_", "AWS_"))}
    env.update(REELBATCH_CACHE_DIR=str(model_cache), PYTHONUNBUFFERED="1")
    return env


@pytest.fixture
def cli_env(tmp_path, model_cache):
    """The embedded default, in a fresh working folder: SQLite, the SQLite broker, a local output folder."""
    return base_env(model_cache)


class Cli:
    def __init__(self, cwd: Path, env: dict):
        self.cwd, self.env = cwd, env

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "jobs", *args], cwd=self.cwd, env=self.env, text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"reelbatch {' '.join(args)} exited {proc.returncode}\n"
                                 f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def json(self, *args: str) -> dict:
        return json.loads(self(*args, "--json").stdout)


@pytest.fixture
def cli(tmp_path, cli_env):
    return Cli(tmp_path, cli_env)
