"""The run report's numbers on rows with known times and costs: every figure checked by hand."""

import html
import json
import re
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


def _page_rows():
    """a stored; b stored and flagged by its flicker check; c failed with nothing stored (no poster, no MP4)."""
    a = video("a", Status.SUCCEEDED, start=10, end=40, render=20.0)
    b = video("b", Status.SUCCEEDED, start=20, end=110, render=30.0)
    c = video("c", Status.FAILED, start=30, end=60, error="failed after 3 attempts: RenderError: blank frames")
    for v in (a, b, c):
        v.flagged, v.uri = v is b, f"file:///o/night/{v.key}.mp4" if v is not c else None
    b.checks = json.dumps({"flicker": {"passed": False, "value": 61.2, "limit": 50},
                           "motion": {"passed": True, "value": 27.0, "limit": 2}})
    return [(a, 10_000), (b, 20_000), (c, 6_000)]


def _page(rows):
    run = Run(id=7, name="night", model="tiny", output="file:///o/", priority=0, source="m.yaml", created_at=T0)
    report = report_dict(run, rows, Price(0.06, "p"), {"idle_usd": 0.004, "idle_s": 4.0, "by_kind_usd": {"gpu": 0.036}})
    # The stages priced at the run's own recorded rate ($0.001 a second here), not today's setting, so an old run's
    # page keeps its numbers.
    page = html_report(report, run, rows, lambda v: b"JPEG" if v.uri else None, usd_per_worker_s=0.001,
                       link_of=lambda v: v.uri)
    return report, page


def _chart(page: str, name: str) -> str:
    return re.search(f'<svg class="chart" data-chart="{name}".*?</svg>', page).group(0)


def test_the_html_report_puts_failed_and_flagged_videos_first_and_links_every_mp4():
    _, page = _page(_page_rows())
    failed, flagged, sheet = (page.index(f'<section id="{s}">') for s in ("failed", "flagged", "sheet"))
    assert failed < flagged < sheet < page.index("Throughput over time")
    # The failed video: its error, and no broken image where it has no poster, no link where it has no MP4.
    assert ('<figure data-video="c"><div class="none">no poster</div><figcaption><b>c</b> p<br><i>failed after 3 '
            'attempts: RenderError: blank frames</i><br>no MP4 stored</figcaption></figure>') in page
    # The flagged one: what failed, its poster and its id both linked to its MP4.
    assert ('<figure data-video="b"><a href="file:///o/night/b.mp4"><img alt="b poster" '
            'src="data:image/jpeg;base64,SlBFRw==" width="192" height="192"></a><figcaption><b>b</b> p<br>'
            '<i>flagged: flicker 61.2 &gt; 50</i><br><a href="file:///o/night/b.mp4">MP4</a></figcaption>') in page
    assert '<section id="sheet"><h2>Contact sheet</h2><figure data-video="a">' in page
    # Every row of the table links its MP4 where one is stored: failed first, then flagged, then the rest.
    table = page[page.index("<h2>Videos</h2>"):]
    assert re.findall(r"<tr><td>(.*?)</td>", table) == [
        "c", '<a href="file:///o/night/b.mp4">b</a>', '<a href="file:///o/night/a.mp4">a</a>']
    assert page.count('href="file:///o/night/a.mp4"') == 3 and page.count('href="file:///o/night/b.mp4"') == 3


def test_the_html_reports_charts_have_axes_with_values_and_its_figures_are_the_text_reports():
    import io

    from rich.console import Console

    from jobs.reports.text import print_report

    report, page = _page(_page_rows())
    ticks = {name: (re.findall(r'class="tick y"[^>]*>([^<]*)<', _chart(page, name)),
                    re.findall(r'class="tick x"[^>]*>([^<]*)<', _chart(page, name))) for name in
             ("throughput", "latency", "stages", "charges")}
    # Stored at 30 s and 100 s after the first claim (10 s): 0 to 2 videos over 0 to 100 s.
    assert ticks["throughput"] == (["0", "1", "2"], ["0", "20", "40", "60", "80", "100"])
    # Flat at 0 until the first finish (x = 64 + 440 x 30 / 100 = 196), up one at each: never a line from zero.
    assert 'points="64.0,174.0 196.0,174.0 196.0,94.0 504.0,94.0 504.0,14.0"' in _chart(page, "throughput")
    # Latencies of 30 s and 90 s in two bins, from 30 s and from 60 s; one video each.
    assert ticks["latency"] == (["0", "1"], ["30", "60"])
    assert re.findall(r'class="value"[^>]*>([^<]*)<', _chart(page, "latency")) == ["1", "1"]
    # 48 s of denoising at $0.001 is $0.048; the axis to $0.05 in steps of $0.01.
    assert ticks["stages"] == (["0", "0.01", "0.02", "0.03", "0.04", "0.05"],
                               ["text", "denoise", "decode", "encode", "upload"])
    assert re.findall(r'class="value"[^>]*>([^<]*)<', _chart(page, "stages")) == [
        "0.001000", "0.048000", "0.001000", "0.000400", "0.000200"]
    assert ticks["charges"] == (["0", "0.01", "0.02", "0.03", "0.04"], ["gpu", "idle"])
    assert re.findall(r'class="value"[^>]*>([^<]*)<', _chart(page, "charges")) == ["0.036000", "0.004000"]
    for name in ("throughput", "latency", "stages", "charges"):
        assert len(re.findall(r'class="title [xy]"', _chart(page, name))) == 2, name
    # The figures: $0.036 charged and $0.004 idle over 2 successes is $0.02 each; 10 video-seconds at $0.06 is $0.60
    # of revenue, a margin of 1 - 0.04 / 0.6 = 93.3%. The same lines in the text report and the page.
    text = io.StringIO()
    print_report(Console(file=text, width=300), report)
    figures = [("2 succeeded, 1 failed; 1 flagged by their checks (on_fail: None); total $0.036000 + $0.004000 idle "
                "worker time (4.0 s, its share); $0.020000 per successful video"),
               "render latency s: P50 60.00, P95 87.00, P99 89.40",
               "gross margin 93.3% at $0.06 per video-second (p)"]
    for line in figures:
        assert line in text.getvalue().splitlines() and html.escape(line) in page, line
    assert report["cost"]["per_successful_video_usd"] == pytest.approx(0.02)


def test_the_html_report_of_a_run_whose_stored_videos_are_all_flagged_has_no_empty_contact_sheet():
    rows = [r for r in _page_rows() if r[0].key != "a"]
    _, page = _page(rows)
    assert '<section id="flagged">' in page and "Contact sheet" not in page
    _, nothing = _page([(video("p", Status.PENDING), 0)])
    assert "<h2>Contact sheet</h2><p>no stored videos</p>" in nothing and "no successful videos" in nothing


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
