"""A run's result files, in the manner of OpenAI's Batch API, written next to its videos once every video is done:

- `{output}{run}/results.jsonl`: one line per video: id, status, uri, poster_uri, sha256, frames, fps, duration_s,
  seed, cost, timings, the image it started from (URI and SHA-256; null for text only), and its checks
  (jobs.render.checks: each check's value, limit and verdict; `flagged` when one failed);
- `{output}{run}/errors.jsonl`: one line per failed or cancelled video: id, error code (the failure's class; for a
  cancelled video "cancelled", or "budget" or "deadline" when its run's cap or deadline cancelled it) and message.

The worker that records a run's last video writes them; `reelbatch report RUN --results` writes them again (after a
resume, say). Both files are replaced whole, atomically.
"""

from __future__ import annotations

import json

from jobs.db import queries
from jobs.db.rows import Run, Video
from jobs.db.status import Status
from jobs.reports.summary import failure_reason
from storage.stores import open_store


def result_files(run: Run, videos: list[tuple[Video, int]]) -> tuple[bytes, bytes]:
    results, errors = [], []
    for v, micro in videos:
        status = Status(v.status)
        results.append({
            "id": v.key, "status": status.value, "uri": v.uri, "poster_uri": v.poster_uri, "sha256": v.sha256,
            "frames": v.frames, "fps": v.fps,
            "duration_s": v.duration_s, "seed": v.seed, "cost_usd": micro / 1e6, "chunks": v.chunks,
            "seam_score": v.seam_score, "image": v.image_uri, "image_sha256": v.image_sha256,
            "flagged": v.flagged, "checks": json.loads(v.checks) if v.checks else None,
            "timings": {"render_s": v.render_s, "text_s": v.text_s, "denoise_s": v.denoise_s, "decode_s": v.decode_s,
                        "encode_s": v.encode_s, "upload_s": v.upload_s,
                        "started_at": v.started_at.isoformat() if v.started_at else None,
                        "finished_at": v.finished_at.isoformat() if v.finished_at else None},
        })
        if status in (Status.FAILED, Status.CANCELLED):
            # A video reelbatch cancelled itself names why (budget, deadline); one a user cancelled, "cancelled".
            code = (v.cancel_reason or "cancelled") if status is Status.CANCELLED else failure_reason(v.last_error)
            errors.append({"id": v.key, "code": code, "message": v.last_error or status.value})
    return _jsonl(results), _jsonl(errors)


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode("utf-8")


def write_results(factory, run: str) -> list[str]:
    """Write the run's result files beside its videos; returns their URIs."""
    row, videos = queries.load_report(factory, run)
    results, errors = result_files(row, videos)
    store = open_store(row.output)
    return [store.replace(f"{row.name}/results.jsonl", results, content_type="application/jsonl"),
            store.replace(f"{row.name}/errors.jsonl", errors, content_type="application/jsonl")]
