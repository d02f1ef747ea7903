"""The run report's numbers on rows with known times and costs: every figure checked by hand."""

from datetime import datetime, timedelta, timezone

import pytest

from jobs.cost.prices import Price
from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.reports.html import html_report
from jobs.reports.summary import failure_reason, report_dict

T0 = datetime(2026, 11, 30, 2, 0, tzinfo=timezone.utc)


def video(key, status, *, start=None, end=None, duration=5.0, error=None, render=0.0):
    return Video(key=key, status=status, prompt="p", negative_prompt=None, seed=1, width=64, height=64, frames=81,
                 fps=16, duration_s=duration, steps=4, guidance=5.0, attempts=1, last_error=error,
                 started_at=None if start is None else T0 + timedelta(seconds=start),
                 finished_at=None if end is None else T0 + timedelta(seconds=end), render_s=render, text_s=0.5,
                 denoise_s=render - 1.0 if render else None, decode_s=0.5 if render else None, encode_s=0.2,
                 upload_s=0.1, chunks=1, seam_score=None, needs_review=False)


def test_report_summary_numbers():
    run = Run(id=7, name="night", model="tiny", output="file:///o/", priority=0, source="m.yaml", created_at=T0)
    rows = [
        (video("a", Status.SUCCEEDED, start=10, end=40, render=20.0), 10_000),   # 30 s claim to stored
        (video("b", Status.SUCCEEDED, start=20, end=110, render=30.0), 20_000),  # 90 s
        (video("c", Status.FAILED, start=30, end=60, error="failed after 3 attempts: RenderError: blank frames"),
         6_000),
        (video("d", Status.FAILED, start=50, end=70, error="ObjectConflict: a different object"), 0),
        (video("e", Status.PENDING), 0),
    ]
    r = report_dict(run, rows, Price(0.06, "test price"))
    assert r["counts"] == {"pending": 1, "running": 0, "succeeded": 2, "failed": 2, "cancelled": 0}
    assert r["failures_by_reason"] == {"RenderError": 1, "ObjectConflict": 1}
    # Active span: first claim (10 s) to last stored video (110 s).
    assert r["throughput"] == {"span_s": 100.0, "videos_per_hour": pytest.approx(72.0),
                               "video_seconds_per_hour": pytest.approx(360.0)}
    assert r["queue_wait_s"]["p50"] == pytest.approx(25.0) and r["queue_wait_s"]["max"] == 50.0
    assert r["render_latency_s"]["p50"] == pytest.approx(60.0)
    assert r["render_latency_s"]["p95"] == pytest.approx(87.0) and r["render_latency_s"]["max"] == 90.0
    assert r["stages_s"] == {"text": 1.0, "denoise": 48.0, "decode": 1.0, "encode": pytest.approx(0.4),
                             "upload": pytest.approx(0.2)}
    # $0.036 in all; failed videos' cost stays in the total, the denominators count successes only.
    assert r["cost"] == {"total_usd": 0.036, "idle_usd": 0.0, "idle_s": 0.0, "by_kind_usd": {},
                         "total_with_idle_usd": 0.036, "per_successful_video_usd": pytest.approx(0.018),
                         "per_successful_video_excluding_idle_usd": pytest.approx(0.018),
                         "per_video_second_usd": pytest.approx(0.0036)}
    # 10 video-seconds at $0.06 = $0.60 of revenue against $0.036 of cost.
    assert r["gross_margin"] == {"price_per_video_second_usd": 0.06, "source": "test price",
                                 "revenue_usd": pytest.approx(0.6), "gross_margin": pytest.approx(0.94)}
    # With the run's share of its workers' idle time ($0.004): shown apart, and in the cost per video and margin.
    idle = report_dict(run, rows, Price(0.06, "test price"),
                       {"idle_usd": 0.004, "idle_s": 4.0, "by_kind_usd": {"gpu": 0.036}})
    assert idle["cost"]["by_kind_usd"] == {"gpu": 0.036, "idle": 0.004}
    assert idle["cost"]["per_successful_video_usd"] == pytest.approx(0.02)
    assert idle["cost"]["per_successful_video_excluding_idle_usd"] == pytest.approx(0.018)
    assert idle["cost"]["per_video_second_usd"] == pytest.approx(0.004)
    assert idle["gross_margin"]["gross_margin"] == pytest.approx(1 - 0.04 / 0.6)


def test_the_html_cost_by_stage_uses_the_rate_the_run_was_charged_at():
    """Stage seconds priced at the run's own recorded rate ($0.001 a second here), not today's setting, so an old
    run's page keeps its numbers: 48 s of denoising is $0.048, 1 s of decoding $0.001."""
    run = Run(id=7, name="night", model="tiny", output="file:///o/", priority=0, source="m.yaml", created_at=T0)
    rows = [(video("a", Status.SUCCEEDED, start=10, end=40, render=20.0), 10_000),
            (video("b", Status.SUCCEEDED, start=20, end=110, render=30.0), 20_000)]
    page = html_report(report_dict(run, rows, Price(0.06, "p")), run, rows, lambda v: None, usd_per_worker_s=0.001)
    assert "<title>denoise: 0.048 USD</title>" in page and "<title>decode: 0.001 USD</title>" in page


def test_a_run_with_nothing_done_reports_no_rates():
    run = Run(id=1, name="idle", model="tiny", output="file:///o/", priority=0, source="m.yaml", created_at=T0)
    r = report_dict(run, [(video("a", Status.PENDING), 0)], Price(0.06, "p"))
    assert r["throughput"]["videos_per_hour"] is None and r["queue_wait_s"] is None
    assert r["cost"]["per_successful_video_usd"] is None and r["gross_margin"] is None


@pytest.mark.parametrize("error, reason", [
    ("failed after 3 attempts: lease expired: worker w1 stopped renewing it", "lease expired"),
    ("ObjectConflict: s3://b/k.mp4 holds other bytes", "ObjectConflict"),
    (None, "unknown"),
])
def test_failure_reasons(error, reason):
    assert failure_reason(error) == reason


def test_capacity_plan_levels_from_a_run():
    """Two successful 5 s videos, 25 GPU-s each (render + encode + upload), over a 100 s span on one GPU: utilisation
    50%; one of them needed a second attempt, so 1 attempt in 3 was a retry."""
    from jobs.reports.capacity import plan

    run = Run(id=7, name="night", model="tiny", output="file:///o/", priority=0, source="m.yaml", created_at=T0)
    a = video("a", Status.SUCCEEDED, start=10, end=40, render=24.7)
    b = video("b", Status.SUCCEEDED, start=20, end=110, render=24.7)
    b.attempts = 2
    p = plan(run, [(a, 0), (b, 0)], gpus=4, run_gpus=1, gpu_hour_usd=3.6, gpu_hour_source="test rate",
             price=Price(0.06, "test price"), headroom=0.2)
    a_ = p["assumptions"]
    assert a_["gpu_seconds_per_successful_video"] == pytest.approx(25.0)
    assert a_["measured_utilisation"] == pytest.approx(0.5) and a_["utilisation_used"] == pytest.approx(0.5)
    assert a_["retry_rate"] == pytest.approx(1 / 3)
    ceiling, sustainable, budget = p["levels"]
    assert ceiling["videos_per_hour"] == pytest.approx(4 * 3600 / 25)  # 576
    assert ceiling["videos_per_day"] == pytest.approx(576 * 24) and ceiling["videos_per_month"] == pytest.approx(
        576 * 24 * 30)
    assert ceiling["cost_per_video_usd"] == pytest.approx(3.6 * 4 / 576)  # $0.025
    assert ceiling["gross_margin"] == pytest.approx((0.3 - 0.025) / 0.3)  # 5 s at $0.06
    assert sustainable["videos_per_hour"] == pytest.approx(288)
    assert budget["videos_per_hour"] == pytest.approx(288 * (2 / 3) * 0.8)
    assert ceiling["cost_per_video_usd"] < sustainable["cost_per_video_usd"] < budget["cost_per_video_usd"]
    assert a_["utilisation_source"].startswith("busy seconds")
    # Where the run's workers had ledger sessions, their charged / up seconds is the measured utilisation.
    measured = plan(run, [(a, 0), (b, 0)], gpus=4, run_gpus=1, gpu_hour_usd=3.6, gpu_hour_source="test rate",
                    price=Price(0.06, "test price"), headroom=0.2, session_utilisation=0.4)
    assert measured["assumptions"]["measured_utilisation"] == pytest.approx(0.4)
    assert measured["assumptions"]["utilisation_source"].startswith("worker sessions")
    assert measured["levels"][1]["videos_per_hour"] == pytest.approx(576 * 0.4)


def test_the_text_report_of_a_large_run_lists_its_first_hundred_videos():
    import io

    from rich.console import Console

    from jobs.reports.text import print_report

    run = Run(id=8, name="big", model="tiny", output="file:///o/", priority=0, source="m.jsonl", created_at=T0)
    rows = [(video(f"v{i:03d}", Status.SUCCEEDED, start=1, end=2, render=2.0), 1000) for i in range(101)]
    rows.append((video("w", Status.FAILED, start=1, end=2, error="RenderError: blank frames"), 0))
    text = io.StringIO()
    print_report(Console(file=text, width=200), report_dict(run, rows))
    lines = text.getvalue().splitlines()
    assert sum(line.startswith("v") for line in lines) == 100 and not any(line.startswith("v100 ") for line in lines)
    assert "  w: RenderError: blank frames" in lines, "errors are listed whatever their row"
    assert "(the first 100 of 102 videos and of 1 errors; `reelbatch report big --json` or `--results` lists every " \
           "one)" in text.getvalue()


def test_the_text_reports_data_lists_only_what_it_shows():
    run = Run(id=9, name="big", model="tiny", output="file:///o/", priority=0, source="m.jsonl", created_at=T0)
    rows = [(video(f"v{i}", Status.SUCCEEDED, start=1, end=2, render=2.0), 1000) for i in range(5)]
    rows.insert(3, (video("w", Status.FAILED, start=1, end=2, error="RenderError: blank frames"), 0))
    listed = report_dict(run, rows, listed=2)
    assert [v["id"] for v in listed["videos"]] == ["v0", "v1", "w"]
    assert listed["counts"]["succeeded"] == 5 and listed["counts"]["failed"] == 1
    assert {k: v for k, v in listed.items() if k != "videos"} == {
        k: v for k, v in report_dict(run, rows).items() if k != "videos"}
