"""Fixtures for the real servers the tests use (S3 via moto, PostgreSQL, Redis), all on 127.0.0.1.

Each server starts once per session, on first use, and stops at session end. A missing server program skips the
tests that need it (listed by `-ra`), unless REELBATCH_REQUIRE_SERVICES=1, as in CI, where it fails them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import services, xdist_units

# tests/gpu needs an NVIDIA GPU; scripts/gpu_check.sh runs it with REELBATCH_GPU_TESTS=1. Elsewhere it is not
# collected at all, rather than collected and skipped.
collect_ignore = [] if os.environ.get("REELBATCH_GPU_TESTS") == "1" else ["gpu"]

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest units of work first (tests/xdist_units.py says why); stable, so the rest keep collection order."""
    items.sort(key=lambda item: xdist_units.rank(item.nodeid))


def _start(start: Callable[[], services.Service]) -> services.Service:
    try:
        return start()
    except services.MissingBinary as exc:
        if os.environ.get("REELBATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{exc} (REELBATCH_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(f"{exc.binary} not installed; install it with: {exc.hint}")


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless Chromium, to open the HTML report as a user's browser would."""
    import shutil

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        exc = services.MissingBinary("chromium", "apt-get install chromium")
        if os.environ.get("REELBATCH_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{exc} (REELBATCH_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(str(exc))
    return found


@pytest.fixture(scope="session")
def s3_server() -> Iterator[services.S3Server]:
    """moto's S3 server; `.endpoint_url` is its http://127.0.0.1:PORT address. Sets no environment."""
    service = _start(services.start_moto)
    try:
        yield services.S3Server(endpoint_url=service.url)
    finally:
        service.stop()


@pytest.fixture
def s3_env(s3_server: services.S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point boto3 (through its own environment handling) at the moto server; yield a fresh, empty bucket's name."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # Anything in the developer's own AWS setup that would win over the variables above, or add to them.
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    bucket = f"reelbatch-test-{uuid.uuid4().hex[:12]}"
    boto3.session.Session().client("s3").create_bucket(Bucket=bucket)
    yield bucket


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster; yields `postgresql+psycopg://postgres@127.0.0.1:PORT/postgres`."""
    service = _start(services.start_postgres)
    try:
        yield service.url
    finally:
        service.stop()


@pytest.fixture
def postgres_url(postgres: str) -> Iterator[str]:
    """A fresh, empty database for one test; yields its `postgresql+psycopg://` URL and drops it afterwards."""
    import psycopg

    name = f"reelbatch_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.libpq_url(postgres), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield postgres.rsplit("/", 1)[0] + f"/{name}"
    # FORCE (PostgreSQL 13+) ends connections a test left open, e.g. an engine it never disposed.
    with psycopg.connect(services.libpq_url(postgres), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """A Redis server with persistence off; yields `redis://127.0.0.1:PORT/0`."""
    service = _start(services.start_redis)
    try:
        yield service.url
    finally:
        service.stop()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One cache folder for the session, so the tiny model is built once and then loaded like any model."""
    return tmp_path_factory.mktemp("model-cache")


@dataclass(frozen=True)
class QuickToy:
    root: Path  # out/ (the diffusers folder, references.npz, README.md) and work/ (checkpoints, train-log.jsonl)
    stdout: str
    models_file: Path  # registers out/ as `toy-quick` with the toy model's native shape


@pytest.fixture(scope="session")
def quick_toy(tmp_path_factory, model_cache) -> QuickToy:
    """`reelbatch toy train --quick` run once per session through the CLI, evaluation included: a model of the toy
    architecture that has trained for a minute, with its references and model card."""
    root = tmp_path_factory.mktemp("quick-toy")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("REELBATCH_")},
           "REELBATCH_CACHE_DIR": str(model_cache)}
    proc = subprocess.run([sys.executable, "-m", "jobs", "toy", "train", "--quick", "--out", str(root / "out"),
                           "--work", str(root / "work")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from engine.models.registry import TOY

    d = TOY.defaults  # registered as `toy` is: the evaluation above rendered its references at these
    models = root / "models.yaml"
    models.write_text(
        f"toy-quick:\n  path: {root / 'out'}\n"
        f"  defaults: {{width: {d.width}, height: {d.height}, fps: {d.fps}, duration_s: {d.duration_s}, "
        f"steps: {d.steps}, guidance: {d.guidance}}}\n"
        f"  temporal_factor: {TOY.temporal_factor}\n  max_frames: {TOY.max_frames}\n"
        f"  max_sequence_length: {TOY.max_sequence_length}\n  chunk_condition: {TOY.chunk_condition}\n")
    return QuickToy(root, proc.stdout, models)
