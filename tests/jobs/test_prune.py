"""`reelbatch prune`: finished runs older than an age removed, unfinished ones kept, objects only with --objects, and
the cost ledger the same after as before; on SQLite and PostgreSQL."""

from datetime import timedelta

from sqlalchemy import func, select
from typer.testing import CliRunner

from jobs.cli import app
from jobs.cost.ledger import sessions
from jobs.db.base import utcnow
from jobs.db.rows import CostRecord, Run, Video, WorkerSession
from jobs.db.status import Status
from jobs.settings import Settings
from jobs.usecases.prune import prune


def seed(factory, out):
    """One worker session up 100 s at $3.60/h (1,000 micro-dollars a second) that charged 10 s to each of four
    succeeded videos: `old` (two, ended 40 days ago), `recent` (one, 1 hour ago), `live` (one, and one pending)."""
    now = utcnow()
    with factory.begin() as s:
        w = WorkerSession(owner="h:1", up_s=100.0, worked_s=100.0, rate_usd_per_hour=3.6, rate_source="test")
        s.add(w)
        for name, states, ago in (("old", [Status.SUCCEEDED, Status.SUCCEEDED], timedelta(days=40)),
                                  ("recent", [Status.SUCCEEDED], timedelta(hours=1)),
                                  ("live", [Status.SUCCEEDED, Status.PENDING], timedelta(days=40))):
            run = Run(name=name, model="tiny", output=f"file://{out}/", source="m.yaml", content_sha256="0" * 64)
            s.add(run)
            s.flush()
            for i, st in enumerate(states):
                v = Video(run_id=run.id, key=f"v{i}", line=i + 1, prompt="p", seed=i, width=64, height=64, frames=9,
                          fps=8, duration_s=1.0, steps=2, guidance=5.0, status=st,
                          uri=f"file://{out}/{name}/v{i}.mp4" if st is Status.SUCCEEDED else None,
                          finished_at=now - ago if st is Status.SUCCEEDED else None)
                s.add(v)
                s.flush()
                if st is Status.SUCCEEDED:
                    s.add(CostRecord(video_id=v.id, session_id=w.id, kind="gpu", seconds=10.0, rate_usd_per_hour=3.6,
                                     rate_source="test", amount_micro_usd=10_000))
    (out / "old").mkdir(parents=True)
    for f in ("v0.mp4", "v1.mp4", "results.jsonl", "errors.jsonl"):
        (out / "old" / f).write_bytes(b"x")


def ledger(factory):
    (w,) = sessions(factory)
    return w.charged_s, w.charged_micro_usd, w.idle_s, w.spread_s, w.runs.get(3), w.pruned_videos


def test_prune_removes_old_finished_runs_keeps_the_rest_and_the_ledger(db_url, factory, tmp_path):
    seed(factory, tmp_path / "out")
    settings = Settings.from_env({}).with_values({"database_url": db_url})
    assert ledger(factory) == (40.0, 40_000, 60.0, 60.0, 1, 0)

    dry = prune(settings, timedelta(days=30), objects=True, dry_run=True)
    assert [(r.name, r.videos, r.objects) for r in dry.removed] == [("old", 2, 4)]
    assert [(k.name, k.why) for k in dry.kept] == [("live", "1 pending")]
    assert dry.recent == 1
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(Run)) == 3
    assert sorted(p.name for p in (tmp_path / "out" / "old").iterdir()) == [
        "errors.jsonl", "results.jsonl", "v0.mp4", "v1.mp4"]

    done = prune(settings, timedelta(days=30))
    assert [(r.name, r.videos, r.objects) for r in done.removed] == [("old", 2, None)]
    with factory() as s:
        assert sorted(s.scalars(select(Run.name))) == ["live", "recent"]
        assert s.scalar(select(func.count()).select_from(Video)) == 3
        assert s.scalar(select(func.count()).select_from(CostRecord)) == 2
    # The session's 20 s charged to `old` stay charged (and its 2 videos served): idle and spread read the same.
    assert ledger(factory) == (40.0, 40_000, 60.0, 60.0, 1, 2)
    assert (tmp_path / "out" / "old" / "v0.mp4").exists(), "objects stay without --objects"

    again = prune(settings, timedelta(minutes=30), objects=True)
    assert [(r.name, r.videos, r.objects) for r in again.removed] == [("recent", 1, 3)]
    assert [(k.name, k.why) for k in again.kept] == [("live", "1 pending")]
    assert ledger(factory) == (40.0, 40_000, 60.0, 60.0, 1, 3)


def test_a_bad_age_is_exit_2_naming_the_option(tmp_path, monkeypatch):
    monkeypatch.setenv("REELBATCH_DATABASE_URL", f"sqlite:///{tmp_path / 'r.db'}")
    got = CliRunner().invoke(app, ["prune", "--older-than", "30 days"])
    assert (got.exit_code, got.output) == (
        2, "--older-than: '30 days' is not an age: use a whole number and d, h or m (30d, 12h, 90m)\n")
    assert not (tmp_path / "r.db").exists()
