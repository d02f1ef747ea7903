"""`reelbatch bench fleet` and `bench scale` at CI size, against a real PostgreSQL and Redis: the measurements run end
to end, and what they must never show (a lost or doubled video) is checked from the rows they leave."""

import resource
import subprocess
import sys

import pytest

from jobs.bench.fleet import Steady, run_fleet, videos_per_model
from jobs.bench.scale import run_scale
from jobs.errors import UsageError
from jobs.settings import Settings
from tests.conftest import REPO


@pytest.fixture
def services(postgres_url, redis_server) -> Settings:
    return Settings.from_env({"REELBATCH_DATABASE_URL": postgres_url, "REELBATCH_BROKER_URL": redis_server})


def test_a_fleet_level_renders_every_video_once(services):
    # 3 simulated workers x 4 batches x 4 videos = 48 videos, 24 per simulated model; time x0.2 with 5 s batches:
    # each batch sleeps 1 s (so every worker is at work together for a while, though the two processes start a
    # second or so apart), and the 120 s lease lasts 24 s (no lease expires on a busy CI machine).
    result = run_fleet(services, levels=(3,), factor=0.2, batch_s=5.0, batches=4, processes=2)
    (level,) = result.levels
    assert (level.workers, level.gpus, level.videos) == (3, 15.0, 48)
    assert (level.duplicates, level.lost, level.failed, level.wasted_attempts) == (0, 0, 0, 0)
    assert level.offered_cycles_per_s == 3.0  # 3 workers / (5 s x 0.2)
    # Every video was claimed in some batch of at most 4, and every claim was timed.
    assert 12 <= level.batches <= 48 and level.claim_ms["max"] > 0
    assert level.transactions_per_video > 2, "at least its claim's share, its checksum and its success"
    assert result.to_dict()["levels"][0]["supports_gpus"] == level.steady_cycles_per_s * 5.0
    assert 0 < level.steady_s < level.span_s and level.steady_claim_ms["max"] <= level.claim_ms["max"]
    # The workers' CPU counts from their start, not their processes' imports: measured here, one fresh process's
    # import costs seconds of CPU (2.9 s here), and the two processes' 48 videos cost less than one such import
    # (counted from the processes' start, the two imports made it 5.8 s).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import jobs.bench.fleet_sim"], cwd=REPO, check=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    import_cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert 0 < level.worker_cpu_s < import_cpu_s, (level.worker_cpu_s, import_cpu_s)


def test_the_sustained_window_runs_while_every_worker_is_at_work():
    # Three workers' claims (worker, when it ended, seconds). The last first claim is sim:1's at 102.0 and the first
    # last claim is sim:0's at 105.0: a 3 s window. Inside it, after 102.0 and up to 105.0: 103.0, 104.0 and 105.0,
    # three cycles started, so 1.0 a second; 102.0 itself, and 101.5 and 106.0 outside, do not count.
    claims = [("sim:0", 100.0, 0.5), ("sim:0", 101.0, 0.6), ("sim:0", 105.0, 0.03),
              ("sim:1", 102.0, 0.7), ("sim:1", 104.0, 0.02), ("sim:1", 109.0, 0.8),
              ("sim:2", 101.5, 0.9), ("sim:2", 103.0, 0.01), ("sim:2", 106.0, 0.4)]
    steady = Steady.of(claims)
    assert steady.seconds == 3.0 and steady.cycles_per_s == 1.0
    assert steady.claim_s == [0.03, 0.02, 0.01]
    # A worker that finished before another started: never all at work, no window.
    assert Steady.of([("sim:0", 100.0, 0.1), ("sim:1", 101.0, 0.1)]) == Steady(0.0, 0.0, [])
    assert Steady.of([]) == Steady(0.0, 0.0, [])


def test_each_model_gets_work_for_as_long_as_its_workers_last():
    # 10 workers: 0, 3, 6, 9 serve sim-a; 1, 4, 7 sim-b; 2, 5, 8 both, half each: sim-a 5.5 of 10, sim-b 4.5.
    assert videos_per_model(10, 480) == {"sim-a": 264, "sim-b": 216}
    # 3 workers: one each, and one for both: an even split.
    assert videos_per_model(3, 24) == {"sim-a": 12, "sim-b": 12}


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


@pytest.mark.parametrize("mode", ["fleet", "scale"])
def test_the_control_plane_benches_refuse_the_embedded_database(tmp_path, mode):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "REELBATCH_DATABASE_URL": f"sqlite:///{tmp_path / 'b.db'}"}
    proc = subprocess.run([sys.executable, "-m", "jobs", "bench", mode], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"bench {mode} measures PostgreSQL: set REELBATCH_DATABASE_URL" in proc.stderr


def test_a_redis_broker_is_required():
    from jobs.bench.scratch import require_services

    with pytest.raises(UsageError, match="bench fleet measures Redis tickets"):
        require_services(Settings.from_env({"REELBATCH_DATABASE_URL": "postgresql+psycopg://x@h/d"}), "bench fleet")
