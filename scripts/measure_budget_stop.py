"""How long a 100,000-video run's budget stop (jobs.db.limits.stop_for_budget: the set-based cancel_waiting) holds its
transaction. Submits a JSONL of N videos with `reelbatch submit` into a fresh SQLite database (the broker unreachable:
the run is recorded, nothing queued), then times the stop in one transaction, as a worker's claim gate makes it.

    PYTHONPATH=$PWD .venv/bin/python scripts/measure_budget_stop.py [N] [DATABASE_URL]

A PostgreSQL URL must name an empty database the script may fill (it runs `reelbatch db upgrade` first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, select

from jobs.db.connect import session_factory
from jobs.db.limits import stop_for_budget
from jobs.db.rows import Run, Video
from jobs.db.service_rows import Team  # noqa: F401 (a run names its team: the table must be mapped)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory(prefix="reelbatch-stop-") as tmp:
        url = sys.argv[2] if len(sys.argv) > 2 else f"sqlite:///{tmp}/stop.db"
        manifest = Path(tmp) / "stop.jsonl"
        manifest.write_text("".join(json.dumps({"id": f"v{i}", "prompt": f"stop video {i}"}) + "\n"
                                    for i in range(count)))
        env = os.environ | {"REELBATCH_DATABASE_URL": url, "REELBATCH_BROKER_URL": "redis://127.0.0.1:1/0"}
        subprocess.run([sys.executable, "-m", "jobs", "db", "upgrade"], env=env, check=True, capture_output=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "jobs", "submit", str(manifest)], env=env, check=True,
                       capture_output=True, cwd=tmp)
        submit_s = time.perf_counter() - t0
        factory = session_factory(url)
        t0 = time.perf_counter()
        with factory.begin() as s:
            run = s.scalars(select(Run)).one()
            cancelled = stop_for_budget(s, run, run.created_at, "budget: measured stop")
        stop_s = time.perf_counter() - t0
        with factory() as s:
            left = s.scalar(select(func.count()).select_from(Video).where(Video.status == "pending"))
        print(json.dumps({"videos": count, "database": url.split(":")[0], "submit_s": round(submit_s, 1),
                          "budget_stop_s": round(stop_s, 2), "cancelled": cancelled, "pending_after": left}))


if __name__ == "__main__":
    main()
