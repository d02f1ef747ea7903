"""A run's report as plain data (for --json) and as a table (for people)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from jobs.models import Run, Video
from jobs.status import Status


def report_dict(run: Run, videos: list[tuple[Video, int]]) -> dict:
    counts = {s.value: 0 for s in Status}
    rows = []
    for v, micro in videos:
        counts[Status(v.status).value] += 1
        rows.append({
            "id": v.key, "status": Status(v.status).value, "uri": v.uri, "prompt": v.prompt, "seed": v.seed,
            "frames": v.frames, "fps": v.fps, "duration_s": v.duration_s, "width": v.width, "height": v.height,
            "steps": v.steps, "guidance": v.guidance, "bytes": v.bytes, "sha256": v.sha256,
            "attempts": v.attempts, "error": v.last_error,
            "render_s": v.render_s, "encode_s": v.encode_s, "upload_s": v.upload_s,
            "chunks": v.chunks, "seam_score": v.seam_score, "needs_review": v.needs_review,
            "cost_usd": micro / 1e6,
        })
    succeeded = counts[Status.SUCCEEDED.value]
    total_micro = sum(m for _, m in videos)
    return {
        "run_id": run.id, "name": run.name, "model": run.model, "output": run.output, "priority": run.priority,
        "source": run.source, "created_at": run.created_at.isoformat(), "counts": counts,
        "cost": {
            "total_usd": total_micro / 1e6,
            # Success-only denominator: failed videos' cost stays in the total.
            "per_successful_video_usd": (total_micro / succeeded / 1e6) if succeeded else None,
        },
        "videos": rows,
    }


def print_report(console: Console, data: dict) -> None:
    console.print(f"run {data['run_id']} [bold]{data['name']}[/] ({data['model']}) -> {data['output']}",
                  highlight=False)
    table = Table("id", "status", "frames", "size", "chunks", "seams", "KiB", "sha256", "cost $", box=None,
                  pad_edge=False)
    for v in data["videos"]:
        kib = f"{v['bytes'] / 1024:.1f}" if v["bytes"] is not None else ""
        seams = "" if v["seam_score"] is None else f"{v['seam_score']:.2f}" + (" REVIEW" if v["needs_review"] else "")
        table.add_row(v["id"], v["status"], f"{v['frames']}@{v['fps']}", f"{v['width']}x{v['height']}",
                      str(v["chunks"]), seams, kib, (v["sha256"] or "")[:12], f"{v['cost_usd']:.6f}")
    console.print(table)
    for v in data["videos"]:
        if v["error"]:
            console.print(f"  {v['id']}: {v['error']}", markup=False, highlight=False)
    counts = ", ".join(f"{n} {k}" for k, n in data["counts"].items() if n)
    per = data["cost"]["per_successful_video_usd"]
    per_text = f"${per:.6f} per successful video" if per is not None else "no successful videos"
    console.print(f"{counts}; total ${data['cost']['total_usd']:.6f}, {per_text}", highlight=False)
