"""`reelbatch report RUN --html FILE`: one self-contained HTML file that opens offline.

A contact sheet (each stored video's poster, its middle frame as a JPEG stored beside its MP4, with prompt and id), a
throughput-over-time chart, a render-latency histogram and a cost breakdown by stage, drawn as inline SVG; posters are
inline JPEGs (data URIs). Nothing is fetched: no fonts, scripts or styles from elsewhere. A few lines of script only check, once
loaded, that every image decoded, and say so on the page (the test reads that in headless Chromium).
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Callable
from datetime import timezone

import numpy as np

from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.reports.summary import STAGES
from jobs.reports.text import failed_checks

THUMB = 192  # pixels wide a poster is drawn at (small clips are scaled up, pixelated)
CHART_W, CHART_H = 480, 160


def _svg_bars(values: list[float], labels: list[str], unit: str) -> str:
    top = max(values) if values and max(values) > 0 else 1.0
    width = CHART_W / max(len(values), 1)
    bars = []
    for i, (value, label) in enumerate(zip(values, labels)):
        h = (CHART_H - 30) * value / top
        x = i * width
        bars.append(f'<rect x="{x + 2:.1f}" y="{CHART_H - 20 - h:.1f}" width="{width - 4:.1f}" height="{h:.1f}" '
                    f'fill="#4a7bd0"><title>{html.escape(label)}: {value:.4g} {unit}</title></rect>'
                    f'<text x="{x + width / 2:.1f}" y="{CHART_H - 5}" font-size="10" text-anchor="middle">'
                    f'{html.escape(label)}</text>')
    return f'<svg width="{CHART_W}" height="{CHART_H}" role="img">{"".join(bars)}</svg>'


def _svg_throughput(times: list[float]) -> str:
    """Cumulative successful videos over seconds since the first claim."""
    if not times:
        return "<p>no successful videos</p>"
    times = sorted(times)
    end = max(times[-1], 1e-9)
    points = ["0,{:.1f}".format(CHART_H - 20)] + [
        f"{(CHART_W - 10) * t / end:.1f},{CHART_H - 20 - (CHART_H - 30) * (i + 1) / len(times):.1f}"
        for i, t in enumerate(times)]
    return (f'<svg width="{CHART_W}" height="{CHART_H}" role="img"><polyline fill="none" stroke="#2a9d4b" '
            f'stroke-width="2" points="{" ".join(points)}"/><text x="4" y="12" font-size="10">{len(times)} videos'
            f'</text><text x="{CHART_W - 10}" y="{CHART_H - 5}" font-size="10" text-anchor="end">{end:.1f} s'
            f'</text></svg>')


def _histogram(values: list[float], bins: int = 10) -> tuple[list[float], list[str]]:
    if not values:
        return [], []
    counts, edges = np.histogram(values, bins=min(bins, max(1, len(values))))
    return [float(c) for c in counts], [f"{edges[i]:.1f}" for i in range(len(counts))]


def _row(r: dict) -> str:
    seams = "" if r["seam_score"] is None else f"{r['seam_score']:.2f}"
    checks = "" if r["checks"] is None else f"FLAGGED: {failed_checks(r['checks'])}" if r["flagged"] else "ok"
    return (f"<tr><td>{html.escape(r['id'])}</td><td>{r['status']}</td><td>{r['frames']}@{r['fps']}</td>"
            f"<td>{r['chunks']}</td><td>{seams}</td><td>{html.escape(checks)}</td><td>{r['cost_usd']:.6f}</td>"
            f"<td>{html.escape(r['error'] or '')}</td></tr>")


def html_report(report: dict, run: Run, videos: list[tuple[Video, int]],
                poster_of: Callable[[Video], bytes | None], usd_per_worker_s: float | None) -> str:
    """`poster_of`: a video's poster JPEG, or None to leave it off the sheet. `usd_per_worker_s`: the rate the run's
    time was charged at, from its cost records (jobs.cost.ledger.run_ledger), so the cost-by-stage chart of an old run
    keeps its numbers when the rate setting changes."""
    ok = [v for v, _ in videos if Status(v.status) is Status.SUCCEEDED]
    starts = [v.started_at.replace(tzinfo=v.started_at.tzinfo or timezone.utc) for v, _ in videos if v.started_at]
    origin = min(starts) if starts else None
    finished = [(v.finished_at.replace(tzinfo=v.finished_at.tzinfo or timezone.utc) - origin).total_seconds()
                for v in ok] if origin else []
    latencies = [(v.finished_at - v.started_at).total_seconds() for v in ok]
    stage_cost = [report["stages_s"][s] * (usd_per_worker_s or 0.0) for s in STAGES]
    kinds = report["cost"].get("by_kind_usd", {})

    # Flagged videos first (jobs.render.checks), each with its poster and what failed; then the rest.
    cards, flagged_cards = [], []
    for v in sorted(ok, key=lambda v: not v.flagged):
        poster = poster_of(v)
        if poster is None:
            continue
        img = (f'<img alt="{html.escape(v.key)} poster" src="data:image/jpeg;base64,'
               f'{base64.b64encode(poster).decode("ascii")}" width="{THUMB}" '
               f'height="{round(THUMB * v.height / v.width)}">')
        why = f"<br><i>flagged: {html.escape(failed_checks(json.loads(v.checks)))}</i>" if v.flagged and v.checks \
            else ""
        (flagged_cards if v.flagged else cards).append(
            f'<figure>{img}<figcaption><b>{html.escape(v.key)}</b> {html.escape(v.prompt)}{why}</figcaption></figure>')
    counts = ", ".join(f"{n} {k}" for k, n in report["counts"].items() if n)
    cost = report["cost"]
    per = cost["per_successful_video_usd"]
    margin = report.get("gross_margin")
    rows = "".join(_row(r) for r in sorted(report["videos"], key=lambda r: not r["flagged"]))
    latency = report["render_latency_s"]
    latency_text = (f"P50 {latency['p50']:.2f} s, P95 {latency['p95']:.2f} s, P99 {latency['p99']:.2f} s"
                    if latency else "none")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>reelbatch run {html.escape(run.name)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
figure {{ display: inline-block; margin: 0 1em 1em 0; max-width: {THUMB + 4}px; vertical-align: top; }}
figure img {{ image-rendering: pixelated; margin-right: 2px; border: 1px solid #ccc; }}
figcaption {{ font-size: 12px; }}
section {{ margin-bottom: 1.5em; }}
table {{ border-collapse: collapse; font-size: 12px; }} td, th {{ padding: 2px 8px; border-bottom: 1px solid #eee; }}
</style></head>
<body data-rendered="pending">
<h1>Run {html.escape(run.name)} <small>({html.escape(run.model)})</small></h1>
<p>{counts}. Total ${cost['total_usd']:.6f}\
{f" + ${cost['idle_usd']:.6f} idle worker time" if cost.get('idle_usd') else ""}; {f"${per:.6f} per successful video" if per else "no successful video"}\
{f"; gross margin {margin['gross_margin']:.1%} at ${margin['price_per_video_second_usd']:g} per video-second" if margin else ""}.
Render latency {latency_text}.</p>
{f'<section id="flagged"><h2>Flagged by their checks</h2>{"".join(flagged_cards)}</section>' if flagged_cards else ""}\
<section><h2>Contact sheet</h2>{"".join(cards) or ("<p>no stored videos</p>" if not flagged_cards else "")}</section>
<section><h2>Throughput over time</h2>{_svg_throughput(finished)}</section>
<section><h2>Render latency (claim to stored), seconds</h2>{_svg_bars(*_histogram(latencies), "videos")}</section>
<section><h2>Cost by stage, USD</h2>{_svg_bars(stage_cost, list(STAGES), "USD")}</section>
<section><h2>Cost by charge, USD (idle: this run's share of its workers' idle time)</h2>\
{_svg_bars(list(kinds.values()), list(kinds), "USD") if kinds else "<p>no charges</p>"}</section>
<section><h2>Videos</h2><table><tr><th>id</th><th>status</th><th>frames</th><th>chunks</th><th>seams</th>
<th>checks</th><th>cost $</th><th>error</th></tr>{rows}</table></section>
<script>
window.addEventListener("error", function (event) {{
  document.body.dataset.errors = (document.body.dataset.errors || "") + event.message + ";";
}});
window.addEventListener("load", function () {{
  var images = Array.prototype.slice.call(document.images);
  var broken = images.filter(function (img) {{ return !img.complete || img.naturalWidth === 0; }});
  document.body.dataset.rendered = broken.length ? "broken:" + broken.length : "ok:" + images.length;
}});
</script>
</body></html>
"""
