"""`reelbatch bench --fleet` and `--scale` at CI size, against a real PostgreSQL and Redis: the measurements run end
to end, and what they must never show (a lost or doubled video) is checked from the rows they leave."""

import subprocess
import sys

import pytest

from jobs.bench.fleet import run_fleet
from jobs.bench.scale import run_scale
from jobs.errors import UsageError
from jobs.settings import Settings
from tests.conftest import REPO


@pytest.fixture
def services(postgres_url, redis_server) -> Settings:
    return Settings.from_env({"REELBATCH_DATABASE_URL": postgres_url, "REELBATCH_BROKER_URL": redis_server})


def test_a_fleet_level_renders_every_video_once(services):
    # 3 simulated workers x 2 batches x 4 videos = 24 videos, 12 per simulated model; time x0.2 with 1 s batches:
    # each batch sleeps 0.2 s, and the 120 s lease lasts 24 s (no lease expires on a busy CI machine).
    result = run_fleet(services, levels=(3,), factor=0.2, batch_s=1.0, batches=2, processes=2)
    (level,) = result.levels
    assert (level.workers, level.gpus, level.videos) == (3, 15.0, 24)
    assert (level.duplicates, level.lost, level.failed, level.wasted_attempts) == (0, 0, 0, 0)
    assert level.offered_cycles_per_s == 15.0  # 3 workers / (1 s x 0.2)
    # Every video was claimed in some batch of at most 4, and every claim was timed.
    assert 6 <= level.batches <= 24 and level.claim_ms["max"] > 0
    assert level.transactions_per_video > 2, "at least its claim's share, its checksum and its success"
    assert result.to_dict()["levels"][0]["supports_gpus"] == level.cycles_per_s * 1.0


def test_the_scale_bench_measures_a_submitted_run_and_the_claim_over_finished_rows(services):
    r = run_scale(services, videos=200, finished=2000, claim_count=10, repeat=1)
    assert r.submit_s > 0 and r.status_s > 0 and r.report_s > 0
    assert r.report_text_s > 0 and r.report_python_s > 0 and r.report_text_python_s > 0
    assert {name: len(times) for name, times in r.runs.items()} == {
        "status": 1, "report_text": 1, "report": 1, "report_text_python": 1, "report_python": 1}
    assert r.claim_ms_pending_only["p50"] > 0 and r.claim_ms_with_finished["p50"] > 0
    # The probe reads the claim index: pending, ready, one model, rank order; the finished rows sort elsewhere.
    plan = "\n".join(r.claim_plan)
    assert "Index Scan using ix_work_units_claim_model" in plan and "Sort" not in plan, plan


@pytest.mark.parametrize("flag", ["--fleet", "--scale"])
def test_the_control_plane_benches_refuse_the_embedded_database(tmp_path, flag):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'b.db'}"}
    proc = subprocess.run([sys.executable, "-m", "jobs", "bench", flag], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"bench {flag} measures PostgreSQL: set REELBATCH_DATABASE_URL" in proc.stderr


def test_a_redis_broker_is_required():
    from jobs.bench.scratch import require_services

    with pytest.raises(UsageError, match="bench --fleet measures Redis tickets"):
        require_services(Settings.from_env({"REELBATCH_DATABASE_URL": "postgresql+psycopg://x@h/d"}), "bench --fleet")
