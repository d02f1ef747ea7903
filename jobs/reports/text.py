"""A run's report for people: jobs.reports.summary's data as a table and a few lines of figures."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

# Videos listed one per line; a larger run's list is cut here (the JSON and the result files hold every video). A
# terminal table of 5,000 rows took 8 s to lay out; 100,000 would take minutes (docs/SCALE.md).
TEXT_ROWS = 100


def print_report(console: Console, data: dict) -> None:
    console.print(f"run {data['run_id']} [bold]{data['name']}[/] ({data['model']}) -> {data['output']}",
                  highlight=False)
    table = Table("id", "status", "frames", "size", "chunks", "seams", "KiB", "sha256", "cost $", box=None,
                  pad_edge=False)
    videos = data["videos"]
    for v in videos[:TEXT_ROWS]:
        kib = f"{v['bytes'] / 1024:.1f}" if v["bytes"] is not None else ""
        seams = "" if v["seam_score"] is None else f"{v['seam_score']:.2f}" + (" REVIEW" if v["needs_review"] else "")
        table.add_row(v["id"], v["status"], f"{v['frames']}@{v['fps']}", f"{v['width']}x{v['height']}",
                      str(v["chunks"]), seams, kib, (v["sha256"] or "")[:12], f"{v['cost_usd']:.6f}")
    console.print(table)
    errors = [v for v in videos if v["error"]]
    for v in errors[:TEXT_ROWS]:
        console.print(f"  {v['id']}: {v['error']}", markup=False, highlight=False)
    total = sum(data["counts"].values())
    if total > TEXT_ROWS or len(errors) > TEXT_ROWS:
        console.print(f"(the first {TEXT_ROWS} of {total:,} videos and of {len(errors):,} errors; "
                      f"`reelbatch report {data['name']} --json` or `--results` lists every one)", highlight=False)
    counts = ", ".join(f"{n} {k}" for k, n in data["counts"].items() if n)
    per = data["cost"]["per_successful_video_usd"]
    per_text = f"${per:.6f} per successful video" if per is not None else "no successful videos"
    idle = data["cost"]["idle_usd"]
    idle_text = f" + ${idle:.6f} idle worker time ({data['cost']['idle_s']:.1f} s, its share)" if idle else ""
    console.print(f"{counts}; total ${data['cost']['total_usd']:.6f}{idle_text}; {per_text}", highlight=False)
    if data["failures_by_reason"]:
        console.print("failures: " + ", ".join(f"{n} {reason}" for reason, n in data["failures_by_reason"].items()),
                      markup=False, highlight=False)
    t = data["throughput"]
    if t["videos_per_hour"]:
        console.print(f"throughput {t['videos_per_hour']:.1f} videos/hour, {t['video_seconds_per_hour']:.1f} "
                      f"video-seconds/hour over {t['span_s']:.1f} s; cost "
                      f"${data['cost']['per_video_second_usd']:.6f} per video-second", highlight=False)
    for name, key in (("queue wait", "queue_wait_s"), ("render latency", "render_latency_s")):
        q = data[key]
        if q:
            console.print(f"{name} s: P50 {q['p50']:.2f}, P95 {q['p95']:.2f}, P99 {q['p99']:.2f}", highlight=False)
    stages = data["stages_s"]
    if any(stages.values()):
        console.print("stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()), highlight=False)
    m = data["gross_margin"]
    if m:
        console.print(f"gross margin {m['gross_margin']:.1%} at ${m['price_per_video_second_usd']:g} per "
                      f"video-second ({m['source']})", highlight=False)
