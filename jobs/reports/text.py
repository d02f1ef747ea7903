"""A run's report for people: jobs.reports.summary's data as a table and a few lines of figures; and how any text a
user wrote (a name, an id, a path, a URI, an error quoting one) is shown on a terminal: as it is.

User text is never read as Rich markup (`[bold]`, `[/x]`) or emoji codes (`:smile:`), and the characters that would
act on the terminal instead of being shown (control characters such as ESC, bidi controls that reorder a line) are
shown escaped, as Python writes them (`\x1b`, `\u202e`). Everything else, brackets and backslashes included, is
printed unchanged.
"""

from __future__ import annotations

import re

from rich.console import Console
from rich.table import Table
from rich.text import Text

# C0 and C1 control characters but the newline (a tab too: Rich would turn it into spaces), the bidi controls
# (Unicode's Bidi_Control property) and the line and paragraph separators.
_UNSHOWABLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                         "\u2028\u2029]")


def visible(text: str) -> str:
    """`text` with each character that would act on the terminal written as its escape; the rest unchanged."""
    return _UNSHOWABLE.sub(lambda m: repr(m.group())[1:-1], text)


def literal(text: object, style: str = "") -> Text:
    """User text as a Rich Text: shown as it is (see visible), never read as markup."""
    return Text(visible(str(text)), style=style)


# Videos listed one per line; a larger run's list is cut here (the JSON and the result files hold every video). A
# terminal table of 5,000 rows took 8 s to lay out; 100,000 would take minutes (docs/SCALE.md).
TEXT_ROWS = 100


def failed_checks(checks: dict | None) -> str:
    """A video's failed checks as "frozen 0.889 > 0.5; motion 0 < 2" (motion has a floor, the others a ceiling)."""
    failed = [(name, c) for name, c in (checks or {}).items() if isinstance(c, dict) and not c["passed"]]
    return "; ".join(f"{name} {c['value']:.3g} {'<' if name == 'motion' else '>'} {c['limit']:g}" for name, c in failed)


def print_report(console: Console, data: dict) -> None:
    console.print(Text.assemble(f"run {data['run_id']} ", literal(data["name"], "bold"),
                                literal(f" ({data['model']}) -> {data['output']}")), soft_wrap=True)
    table = Table("id", "status", "frames", "size", "chunks", "seams", "checks", "KiB", "sha256", "cost $", box=None,
                  pad_edge=False)
    table.columns[0].overflow = "fold"  # an id is shown whole, wrapped if it must be, never cut short
    # Flagged videos first (jobs.render.checks): what a person should look at before the rest.
    videos = data["videos"]
    flagged = [v for v in videos if v["flagged"]]
    for v in (flagged + [v for v in videos if not v["flagged"]])[:TEXT_ROWS]:
        kib = f"{v['bytes'] / 1024:.1f}" if v["bytes"] is not None else ""
        seams = "" if v["seam_score"] is None else f"{v['seam_score']:.2f}" + (" REVIEW" if v["needs_review"] else "")
        verdict = "" if v["checks"] is None else "FLAGGED" if v["flagged"] else "ok"
        table.add_row(literal(v["id"]), v["status"], f"{v['frames']}@{v['fps']}", f"{v['width']}x{v['height']}",
                      str(v["chunks"]), seams, verdict, kib, (v["sha256"] or "")[:12], f"{v['cost_usd']:.6f}")
    console.print(table)
    for v in flagged[:TEXT_ROWS]:
        console.print(literal(f"  FLAGGED {v['id']}: {failed_checks(v['checks'])}"), soft_wrap=True)
    errors = [v for v in videos if v["error"]]
    for v in errors[:TEXT_ROWS]:
        console.print(literal(f"  {v['id']}: {v['error']}"), soft_wrap=True)
    total = sum(data["counts"].values())
    if total > TEXT_ROWS or len(errors) > TEXT_ROWS:
        console.print(literal(f"(the first {TEXT_ROWS} of {total:,} videos and of {len(errors):,} errors; "
                              f"`reelbatch report {data['name']} --json` or `--results` lists every one)"),
                      soft_wrap=True)
    for line in summary_lines(data):
        console.print(literal(line), soft_wrap=True)


def summary_lines(data: dict) -> list[str]:
    """The report's figures as the text report prints them after its table, one line each (the HTML page shows the
    same lines, so their numbers agree)."""
    counts = ", ".join(f"{n} {k}" for k, n in data["counts"].items() if n)
    per = data["cost"]["per_successful_video_usd"]
    per_text = f"${per:.6f} per successful video" if per is not None else "no successful videos"
    idle = data["cost"]["idle_usd"]
    idle_text = f" + ${idle:.6f} idle worker time ({data['cost']['idle_s']:.1f} s, its share)" if idle else ""
    checks = data["checks"]
    flagged_text = f"; {checks['flagged']} flagged by their checks (on_fail: {checks['on_fail']})" \
        if checks["flagged"] else ""
    lines = [f"{counts}{flagged_text}; total ${data['cost']['total_usd']:.6f}{idle_text}; {per_text}"]
    if data["failures_by_reason"]:
        lines.append("failures: " + ", ".join(f"{n} {reason}" for reason, n in data["failures_by_reason"].items()))
    t = data["throughput"]
    if t["videos_per_hour"]:
        lines.append(f"throughput {t['videos_per_hour']:.1f} videos/hour, {t['video_seconds_per_hour']:.1f} "
                     f"video-seconds/hour over {t['span_s']:.1f} s; cost "
                     f"${data['cost']['per_video_second_usd']:.6f} per video-second")
    for name, key in (("queue wait", "queue_wait_s"), ("render latency", "render_latency_s")):
        q = data[key]
        if q:
            lines.append(f"{name} s: P50 {q['p50']:.2f}, P95 {q['p95']:.2f}, P99 {q['p99']:.2f}")
    stages = data["stages_s"]
    if any(stages.values()):
        lines.append("stage seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    lines += limit_lines(data)
    m = data["gross_margin"]
    if m:
        lines.append(f"gross margin {m['gross_margin']:.1%} at ${m['price_per_video_second_usd']:g} per "
                     f"video-second ({m['source']})")
    return lines


def limit_lines(data: dict) -> list[str]:
    """What the run's cost cap and deadline did."""
    cancelled = data["cancelled_by_reason"]
    lines = []
    if data["max_cost_usd"] is not None:
        reached = (f"; reached at {data['budget_reached_at']}: {cancelled.get('budget', 0)} videos not started "
                   "(cancelled, reason budget)" if data["budget_reached_at"] else "")
        lines.append(f"max_cost_usd ${data['max_cost_usd']:g}: charged ${data['cost']['total_usd']:.6f}{reached}")
    if data["deadline"]:
        expired = (f": EXPIRED at {data['expired_at']}; {cancelled.get('deadline', 0)} videos not started before it "
                   "(cancelled, reason deadline)" if data["expired"] else "")
        lines.append(f"deadline {data['deadline']}{expired}")
    return lines
