"""`reelbatch bench --fleet` and `--scale` at CI size, against a real PostgreSQL and Redis: the measurements run end
to end, and what they must never show (a lost or doubled video) is checked from the rows they leave."""

import resource
import subprocess
import sys

import pytest

from jobs.bench.fleet import Steady, run_fleet
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
    assert result.to_dict()["levels"][0]["supports_gpus"] == level.steady_cycles_per_s * 1.0
    assert 0 < level.steady_s < level.span_s and level.steady_claim_ms["max"] <= level.claim_ms["max"]
    # The workers' CPU counts from their start, not their processes' imports: measured here, one fresh process's
    # import costs seconds of CPU (2.9 s here), and the two processes' 24 videos cost less than one such import
    # (counted from the processes' start, the two imports made it 5.8 s).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import jobs.bench.fleet_sim"], cwd=REPO, check=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    import_cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert 0 < level.worker_cpu_s < import_cpu_s, (level.worker_cpu_s, import_cpu_s)


def test_the_sustained_window_is_the_middle_eight_tenths_of_the_finished_videos():
    # 20 videos finished one a second, t = 100..119, in 5 batches of 4. The window runs from the 3rd finish (index
    # 2: t = 102) to the 19th (index 18: t = 118): 16 s holding the 16 finishes at t = 103..118, which is 4 batches'
    # worth, so 0.25 cycles a second. Claims ending at 101.9 and 118.1 are outside; 102 and 118 count.
    finished = [100.0 + i for i in range(20)]
    claims = [(101.9, 0.5), (102.0, 0.01), (110.0, 0.02), (118.0, 0.03), (118.1, 0.9)]
    steady = Steady.of(finished, 5, claims)
    assert steady.seconds == 16.0 and steady.cycles_per_s == 0.25
    assert steady.claim_s == [0.01, 0.02, 0.03]
    # Fewer than 10 videos: no middle to speak of.
    assert Steady.of(finished[:9], 3, claims) == Steady(0.0, 0.0, [])


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
