"""`reelbatch report RUN --html FILE`: one self-contained HTML file that opens offline.

What a person should look at comes first: the failed videos (their error, their poster where one was stored) and the
videos flagged by their checks (what failed), then the contact sheet of the rest (each stored video's poster, its
middle frame as a JPEG stored beside its MP4, with prompt and id). Every poster and every row of the table links to
its video's MP4. Then four charts (jobs.reports.charts: labelled axes, each tick and bar with its value): videos
stored over time, render latency, cost by stage and cost by charge. The figures are the report's own (the data of
`report --json`) written as the text report writes them, so the page, the text and the JSON agree.

Posters are inline JPEGs (data URIs); nothing is fetched: no fonts, scripts or styles from elsewhere. A few lines of
script only check, once loaded, that every image decoded, and say so on the page (the test reads that in headless
Chromium).
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
from jobs.reports.charts import bars, number, steps
from jobs.reports.summary import STAGES
from jobs.reports.text import failed_checks, summary_lines

THUMB = 192  # pixels wide a poster is drawn at (small clips are scaled up, pixelated)


def _usd(value: float) -> str:
    return f"{value:.6f}"  # as the text report writes dollars (jobs.reports.text)


def _histogram(values: list[float], bins: int = 10) -> tuple[list[float], list[str]]:
    """Counts per bin, each labelled with where it starts (seconds)."""
    if not values:
        return [], []
    counts, edges = np.histogram(values, bins=min(bins, max(1, len(values))))
    return [float(c) for c in counts], [number(float(edges[i])) for i in range(len(counts))]


def _link(uri: str | None, text: str) -> str:
    return f'<a href="{html.escape(uri)}">{text}</a>' if uri else text


def _checks(v: Video) -> str:
    return failed_checks(json.loads(v.checks)) if v.checks else ""


def _row(r: dict, link: str | None) -> str:
    seams = "" if r["seam_score"] is None else f"{r['seam_score']:.2f}"
    checks = "" if r["checks"] is None else f"FLAGGED: {failed_checks(r['checks'])}" if r["flagged"] else "ok"
    return (f"<tr><td>{_link(link, html.escape(r['id']))}</td><td>{r['status']}</td><td>{r['frames']}@{r['fps']}</td>"
            f"<td>{r['chunks']}</td><td>{r['attempts']}</td><td>{seams}</td><td>{html.escape(checks)}</td>"
            f"<td>{_usd(r['cost_usd'])}</td><td>{html.escape(r['error'] or '')}</td></tr>")


def _card(v: Video, poster: bytes | None, link: str | None, why: str) -> str:
    """A video's figure: its poster (or a line saying it has none: never a broken image) linked to its MP4, its id,
    prompt and `why` it is here."""
    if poster is not None:
        img = (f'<img alt="{html.escape(v.key)} poster" src="data:image/jpeg;base64,'
               f'{base64.b64encode(poster).decode("ascii")}" width="{THUMB}" '
               f'height="{round(THUMB * v.height / v.width)}">')
        picture = _link(link, img)
    else:
        picture = f'<div class="none">{_link(link, "no poster")}</div>'
    mp4 = f"<br>{_link(link, 'MP4')}" if link else "<br>no MP4 stored"
    reason = f"<br><i>{html.escape(why)}</i>" if why else ""
    return (f'<figure data-video="{html.escape(v.key)}">{picture}<figcaption><b>{html.escape(v.key)}</b> '
            f'{html.escape(v.prompt)}{reason}{mp4}</figcaption></figure>')


def _section(name: str, title: str, cards: list[str]) -> str:
    return f'<section id="{name}"><h2>{title}</h2>{"".join(cards)}</section>' if cards else ""


def html_report(report: dict, run: Run, videos: list[tuple[Video, int]],
                poster_of: Callable[[Video], bytes | None], usd_per_worker_s: float | None,
                link_of: Callable[[Video], str | None] = lambda v: None) -> str:
    """`poster_of`: a video's poster JPEG, or None to show it without one. `link_of`: where its MP4 opens from
    (None: no stored MP4). `usd_per_worker_s`: the rate the run's time was charged at, from its cost records
    (jobs.cost.ledger.run_ledger), so the cost-by-stage chart of an old run keeps its numbers when the rate setting
    changes."""
    ok = [v for v, _ in videos if Status(v.status) is Status.SUCCEEDED]
    failed = [v for v, _ in videos if Status(v.status) is Status.FAILED]
    starts = [v.started_at.replace(tzinfo=v.started_at.tzinfo or timezone.utc) for v, _ in videos if v.started_at]
    origin = min(starts) if starts else None
    finished = [(v.finished_at.replace(tzinfo=v.finished_at.tzinfo or timezone.utc) - origin).total_seconds()
                for v in ok] if origin else []
    latencies = [(v.finished_at - v.started_at).total_seconds() for v in ok]
    stage_cost = [report["stages_s"][s] * (usd_per_worker_s or 0.0) for s in STAGES]
    kinds = report["cost"].get("by_kind_usd", {})
    links = {v.key: link_of(v) for v, _ in videos}

    # Failed videos, then flagged ones (jobs.render.checks), each with its poster, why and its link; then the rest.
    failed_cards = [_card(v, poster_of(v), links[v.key], (v.last_error or "failed")
                          + (f"; flagged: {_checks(v)}" if v.flagged else "")) for v in failed]
    flagged_cards = [_card(v, poster_of(v), links[v.key], f"flagged: {_checks(v)}") for v in ok if v.flagged]
    sheet = [_card(v, poster, links[v.key], "") for v in ok if not v.flagged
             for poster in [poster_of(v)] if poster is not None]
    if sheet:
        contact = _section("sheet", "Contact sheet", sheet)
    elif not ok:
        contact = '<section id="sheet"><h2>Contact sheet</h2><p>no stored videos</p></section>'
    else:
        contact = ""  # every stored video is flagged (shown above) or has no poster (in the table below)
    rows = "".join(_row(r, links.get(r["id"])) for r in
                   sorted(report["videos"], key=lambda r: (r["status"] != "failed", not r["flagged"])))
    figures = "<br>\n".join(html.escape(line) for line in summary_lines(report))
    throughput = (steps("throughput", finished, "seconds since the first claim", "videos stored")
                  if finished else "<p>no successful videos</p>")
    latency_chart = (bars("latency", *_histogram(latencies), "seconds from claim to stored (bin start)", "videos",
                          value_text=lambda n: f"{n:.0f}", whole=True) if latencies else "<p>no successful videos</p>")
    charges = (bars("charges", list(kinds.values()), list(kinds), "charge", "USD", value_text=_usd)
               if kinds else "<p>no charges</p>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>reelbatch run {html.escape(run.name)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
figure {{ display: inline-block; margin: 0 1em 1em 0; max-width: {THUMB + 4}px; vertical-align: top; }}
figure img {{ image-rendering: pixelated; margin-right: 2px; border: 1px solid #ccc; }}
figure .none {{ width: {THUMB}px; height: {THUMB // 2}px; border: 1px dashed #aaa; display: flex;
  align-items: center; justify-content: center; font-size: 12px; }}
figcaption {{ font-size: 12px; }}
#failed h2 {{ color: #b00020; }} #flagged h2 {{ color: #a05a00; }}
section {{ margin-bottom: 1.5em; }}
table {{ border-collapse: collapse; font-size: 12px; }} td, th {{ padding: 2px 8px; border-bottom: 1px solid #eee; }}
</style></head>
<body data-rendered="pending">
<h1>Run {html.escape(run.name)} <small>({html.escape(run.model)})</small></h1>
<p id="figures">{figures}</p>
{_section("failed", "Failed", failed_cards)}{_section("flagged", "Flagged by their checks", flagged_cards)}{contact}
<section><h2>Throughput over time</h2>{throughput}</section>
<section><h2>Render latency (claim to stored)</h2>{latency_chart}</section>
<section><h2>Cost by stage</h2>{bars("stages", stage_cost, list(STAGES), "stage", "USD", value_text=_usd)}</section>
<section><h2>Cost by charge (idle: this run's share of its workers' idle time)</h2>{charges}</section>
<section><h2>Videos</h2><table><tr><th>id</th><th>status</th><th>frames</th><th>chunks</th><th>attempts</th>
<th>seams</th><th>checks</th><th>cost $</th><th>error</th></tr>{rows}</table></section>
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
