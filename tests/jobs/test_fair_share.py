"""Teams sharing a fleet, in the real claim on real rows (SQLite and PostgreSQL): a team with 10,000 videos waiting
cannot starve one with 10, claims follow the shares, `max_gpus` and `monthly_usd` stop a team's new claims, and
priority still orders work inside a team."""

from __future__ import annotations

import json

from sqlalchemy import update

from jobs.claims import claims
from jobs.claims.fair import FairShare
from jobs.db import submission, teams
from jobs.db.base import utcnow
from jobs.db.rows import CostRecord, Video, WorkUnit
from jobs.db.status import Status
from jobs.manifest import load_manifest


def submit(factory, registry, tmp_path, team: str, name: str, videos: int, priority: int = 0) -> None:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"id": f"{name}-{i}", "prompt": "p"}) + "\n" for i in range(videos)))
    spec = load_manifest(path, registry=registry, priority=priority)
    with factory() as s:
        team_id = teams.find_team(s, team).id
    submission.submit_run(factory, spec, output="file:///tmp/out/", team_id=team_id)


def claim(factory, fair, owner="w1", max_batch=1):
    return claims.claim_batch(factory, owner=owner, max_batch=max_batch, lease_s=60, fair=fair)


def finish(factory, claimed) -> None:
    """The batch rendered: its units and videos succeeded (what the worker records, without rendering)."""
    with factory.begin() as s:
        s.execute(update(WorkUnit).where(WorkUnit.id.in_([u.unit_id for u in claimed.units]))
                  .values(status=Status.SUCCEEDED))
        s.execute(update(Video).where(Video.id.in_([u.video_id for u in claimed.units]))
                  .values(status=Status.SUCCEEDED))


def test_a_team_of_10_is_not_starved_by_a_team_of_10000(factory, registry, tmp_path):
    teams.add_team(factory, "big")
    teams.add_team(factory, "small")
    submit(factory, registry, tmp_path, "big", "big", 10_000)
    fair = FairShare()
    first = claim(factory, fair, max_batch=4)  # only the big team waits: the plain claim, its oldest four
    assert [u.key for u in first.units] == ["big-0", "big-1", "big-2", "big-3"]
    submit(factory, registry, tmp_path, "small", "small", 10)
    # The next batch, on another worker, while the big team's batch still runs: the small team's first video.
    second = claim(factory, fair, owner="w2", max_batch=4)
    assert [u.key for u in second.units] == ["small-0", "small-1", "small-2", "small-3"]
    finish(factory, first)
    finish(factory, second)
    # Over a window of 12 one-video claims by one worker, each team's claims are its share: 6 and 6 (the small
    # team's other 6 videos), alternating.
    window = []
    for _ in range(12):
        c = claim(factory, fair)
        window.append(c.units[0].key)
        finish(factory, c)
    assert [k for k in window if k.startswith("small")] == [f"small-{i}" for i in range(4, 10)]
    assert [k for k in window if k.startswith("big")] == [f"big-{i}" for i in range(4, 10)]
    # The small team is done: the big team alone from here.
    assert [claim(factory, fair).units[0].key for _ in range(2)] == ["big-10", "big-11"]


def test_claims_follow_shares_and_priority_orders_a_teams_own_work(factory, registry, tmp_path):
    teams.add_team(factory, "three", share=3)
    teams.add_team(factory, "one", share=1)
    submit(factory, registry, tmp_path, "three", "low", 30, priority=0)
    submit(factory, registry, tmp_path, "three", "high", 30, priority=5)
    submit(factory, registry, tmp_path, "one", "solo", 30)
    fair = FairShare()
    window = []
    for _ in range(20):
        c = claim(factory, fair)
        window.append(c.units[0].run_name)
        finish(factory, c)
    # 3:1 of 20 claims: 15 and 5; the team of share 3 took its priority-5 run first.
    assert window.count("solo") == 5 and window.count("high") == 15 and "low" not in window, window


def test_max_gpus_and_the_monthly_cap_stop_a_teams_new_claims(factory, registry, tmp_path):
    teams.add_team(factory, "capped", max_gpus=1)
    teams.add_team(factory, "thrifty", monthly_usd=1.0)
    submit(factory, registry, tmp_path, "capped", "capped", 5)
    fair = FairShare()
    held = claim(factory, fair, owner="w1")
    assert held.units[0].run_name == "capped"
    assert claim(factory, fair, owner="w2") is None, "its one GPU is busy: nothing else of it starts"
    finish(factory, held)
    assert claim(factory, fair, owner="w2").units[0].run_name == "capped"
    # The thrifty team: $1.000001 charged this month is past its $1 cap, so none of its work starts.
    submit(factory, registry, tmp_path, "thrifty", "thrifty", 3)
    first = claim(factory, FairShare(), owner="w3")  # capped's one GPU is busy: thrifty's turn
    assert first.units[0].run_name == "thrifty"
    with factory.begin() as s:
        s.add(CostRecord(video_id=first.units[0].video_id, kind="gpu", seconds=1.0, rate_usd_per_hour=1.0,
                         rate_source="test", amount_micro_usd=1_000_001, created_at=utcnow()))
    finish(factory, first)
    assert claim(factory, FairShare(), owner="w4") is None, "over its month's cap, and capped's GPU is busy"


def test_status_and_metrics_show_each_teams_running_queued_and_month_to_date(factory, registry, tmp_path):
    from datetime import timedelta

    from prometheus_client import REGISTRY

    from jobs.observe import prometheus

    teams.add_team(factory, "a", monthly_usd=5)
    teams.add_team(factory, "b", share=2)
    submit(factory, registry, tmp_path, "a", "a", 3)
    submit(factory, registry, tmp_path, "b", "b", 2)
    running = claims.claim_batch(factory, owner="w1", max_batch=2, lease_s=60)  # no fair share: a's, the oldest
    assert [u.key for u in running.units] == ["a-0", "a-1"]
    now = utcnow()
    with factory.begin() as s:
        for micro, when in ((250_000, now), (1_000_000, teams.month_start(now) - timedelta(seconds=1))):
            s.add(CostRecord(video_id=running.units[0].video_id, kind="gpu", seconds=1.0, rate_usd_per_hour=1.0,
                             rate_source="test", amount_micro_usd=micro, created_at=when))
    found = teams.usage(factory, now)
    assert [(u.team, u.running, u.queued, u.month_usd, u.monthly_usd, u.share) for u in found] == [
        ("default", 0, 0, 0.0, None, 1.0), ("a", 2, 1, 0.25, 5.0, 1.0), ("b", 0, 2, 0.0, None, 2.0)]
    prometheus.publish_teams(found)
    assert REGISTRY.get_sample_value("reelbatch_team_running", {"team": "a"}) == 2
    assert REGISTRY.get_sample_value("reelbatch_team_queued", {"team": "b"}) == 2
    assert REGISTRY.get_sample_value("reelbatch_team_month_usd", {"team": "a"}) == 0.25
