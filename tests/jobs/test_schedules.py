"""Schedules against SQLite and a real PostgreSQL: adding, firing exactly once per fire time, crashes, bad manifests.

Tickets go to a real SQLite broker file of this module's own and are counted there.
"""

import sqlite3
import threading
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from sqlalchemy import func, select

from jobs.db import submission
from jobs.db.base import utcnow
from jobs.db.connect import session_factory
from jobs.db.rows import Run, Video
from jobs.db.service_rows import Firing, Schedule
from jobs.errors import UsageError
from jobs.manifest import load_manifest
from jobs.settings import Settings
from jobs.work import firing
from jobs.work.app import create_app
from jobs.work.schedules import (
    MAX_SCHEDULE_NAME,
    RESUME_AFTER,
    add_schedule,
    due_fire_time,
    list_schedules,
    remove_schedule,
)
from jobs.work.tickets import send_tickets

UTC = timezone.utc
# Far after any schedule a test adds, so the fire times are after the schedule's creation.
NIGHT = datetime(2099, 1, 1, 2, 0, 30, tzinfo=UTC)
GOOD = "name: ignored\nvideos:\n  - id: a\n    prompt: a red circle\n  - id: b\n    prompt: a blue square\n"
BAD = "name: ignored\nvideos:\n  - id: a\n    prompt: ok\n    seeed: 3\n  - id: a\n    prompt: dup\n"


@pytest.fixture(scope="module")
def celery(tmp_path_factory):
    """A Celery app on a SQLite broker file of this module's own (the tickets are counted there)."""
    path = tmp_path_factory.mktemp("broker") / "broker.db"
    settings = Settings.from_env({}).with_values({"broker_url": f"sqla+sqlite:///{path}"})
    return create_app(settings), path


@pytest.fixture
def broker(celery):
    return celery[1]


@pytest.fixture
def fire_due(celery):
    """jobs.work.firing.fire_due sending its tickets through this module's app, as the worker's task does."""
    app = celery[0]
    return lambda factory, settings, now: firing.fire_due(factory, settings, now,
                                                          lambda n, model: send_tickets(app, n, model))


def tickets(broker) -> int:
    if not broker.exists():
        return 0
    with sqlite3.connect(broker) as conn:
        return conn.execute("select count(*) from kombu_message").fetchone()[0]


@pytest.fixture
def settings(db_url, tmp_path):
    return Settings.from_env({}).with_values({"database_url": db_url,
                                              "manifest.default_output": f"file://{tmp_path}/out/"})


def manifest(tmp_path, text=GOOD, name="night.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def count(factory, model, *where) -> int:
    with factory() as s:
        return s.scalar(select(func.count()).select_from(model).where(*where))


def run_names(factory) -> list[str]:
    with factory() as s:
        return list(s.scalars(select(Run.name).order_by(Run.name)))


def test_add_list_and_remove(factory, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    manifest(tmp_path)
    info = add_schedule(factory, "nightly", "night.yaml", "  0 2  * * * ")
    assert (info.name, info.manifest, info.cron) == ("nightly", str(tmp_path / "night.yaml"), "0 2 * * *")
    assert info.next_fire_time > utcnow() and (info.next_fire_time.hour, info.next_fire_time.minute) == (2, 0)
    add_schedule(factory, "often", str(tmp_path / "night.yaml"), "* * * * * */2")
    listed = list_schedules(factory)
    assert [s.name for s in listed] == ["nightly", "often"] and all(s.last_firing is None for s in listed)
    assert listed[1].next_fire_time - utcnow() <= timedelta(seconds=2), "a 6th field is seconds"
    remove_schedule(factory, "often")
    assert [s.name for s in list_schedules(factory)] == ["nightly"]
    with pytest.raises(UsageError, match="no schedule named 'often'"):
        remove_schedule(factory, "often")
    with pytest.raises(UsageError, match="'nightly' already exists"):
        add_schedule(factory, "nightly", str(tmp_path / "night.yaml"), "0 3 * * *")


@pytest.mark.parametrize("name, manifest_arg, cron, message", [
    ("a/b", "night.yaml", "0 2 * * *", r"may hold only letters.*has '/'"),
    ("x" * (MAX_SCHEDULE_NAME + 1), "night.yaml", "0 2 * * *", "NAME-YYYYmmddTHHMMSSZ fits"),
    ("n", "night.yaml", "0 2 * *", "has 4 fields"),
    ("n", "night.yaml", "0 2 * * * 0 2099", "has 7 fields"),
    ("n", "night.yaml", "@daily", "has 1 fields"),
    ("n", "night.yaml", "61 * * * *", "is not valid"),
    ("n", "night.yaml", "0 0 31 2 *", "never fires"),
    ("n", "missing.yaml", "0 2 * * *", "no file"),
    ("n", ".", "0 2 * * *", "not a manifest name"),
    ("n", "night.txt", "0 2 * * *", "not a manifest name"),
    ("n", "https://example.invalid/night.yaml", "0 2 * * *", "a file path or an s3://"),
    ("n", "s3://bucket-only", "0 2 * * *", "s3://BUCKET/KEY"),
])
def test_add_refuses_bad_input_and_writes_nothing(tmp_path, monkeypatch, name, manifest_arg, cron, message):
    monkeypatch.chdir(tmp_path)
    manifest(tmp_path)
    manifest(tmp_path, name="night.txt")
    factory = session_factory(f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(UsageError, match=message):
        add_schedule(factory, name, manifest_arg, cron)
    assert list_schedules(factory) == []


def test_due_fire_time_is_the_latest_at_or_before_now_after_creation():
    created = datetime(2099, 1, 1, 1, 0, tzinfo=UTC)
    two = datetime(2099, 1, 1, 2, 0, tzinfo=UTC)
    assert due_fire_time("0 2 * * *", created, two - timedelta(microseconds=1)) is None
    assert due_fire_time("0 2 * * *", created, two) == two, "a fire time is due at that very second"
    assert due_fire_time("0 2 * * *", created, two + timedelta(days=3, hours=5)) == two + timedelta(days=3)
    assert due_fire_time("0 2 * * *", two, two + timedelta(hours=1)) is None, "not a time before it was added"
    assert due_fire_time("* * * * * */2", created, two + timedelta(seconds=5.9)) == two + timedelta(seconds=4)


def test_a_firing_makes_one_run_named_after_its_fire_time_and_fires_once(fire_due, factory, settings, tmp_path, broker):
    add_schedule(factory, "nightly", str(manifest(tmp_path)), "0 2 * * *")
    before = tickets(broker)
    (result,) = fire_due(factory, settings, NIGHT)
    assert (result.schedule, result.ok, result.errors, result.resumed) == ("nightly", True, None, False)
    assert result.fire_time == datetime(2099, 1, 1, 2, 0, tzinfo=UTC)
    assert result.run_name == "nightly-20990101T020000Z" and run_names(factory) == [result.run_name]
    assert count(factory, Video, Video.run_id == result.run_id) == 2
    assert tickets(broker) - before == 2, "one ticket per pending unit"
    with factory() as s:
        run = s.get(Run, result.run_id)
        assert run.output == f"file://{tmp_path}/out/" and run.source == str(tmp_path / "night.yaml")
    # A second beat's tick, a restarted beat, a later tick in the same hour: nothing new.
    assert fire_due(factory, settings, NIGHT) == []
    assert fire_due(factory, settings, NIGHT + timedelta(minutes=59)) == []
    assert count(factory, Run) == 1 and count(factory, Firing) == 1 and tickets(broker) - before == 2
    # Nothing ran for four days: only the most recent missed fire time fires.
    (later,) = fire_due(factory, settings, NIGHT + timedelta(days=4))
    assert later.run_name == "nightly-20990105T020000Z"
    assert run_names(factory) == ["nightly-20990101T020000Z", "nightly-20990105T020000Z"]
    (listed,) = list_schedules(factory)
    assert listed.last_firing.run_name == later.run_name and listed.last_firing.state == "ok"
    remove_schedule(factory, "nightly")
    assert count(factory, Firing) == 0 and count(factory, Run) == 2, "its firings go with it; its runs stay"


def race(callers: int, call) -> list:
    """Run `call` in `callers` threads released together; every result, or the first exception."""
    barrier, results, errors = threading.Barrier(callers), [], []

    def one():
        try:
            barrier.wait()
            results.extend(call())
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_concurrent_callers_make_one_firing_and_one_run(fire_due, factory, settings, tmp_path, broker):
    add_schedule(factory, "nightly", str(manifest(tmp_path)), "0 2 * * *")
    before = tickets(broker)
    results = race(4, lambda: fire_due(factory, settings, NIGHT))
    assert [r.run_name for r in results] == ["nightly-20990101T020000Z"]
    assert count(factory, Run) == 1 and count(factory, Firing) == 1
    assert tickets(broker) - before == 2, "only the caller that fired sends tickets"
    # Concurrent takers of a firing left in progress: one takes it over.
    _left_in_progress(factory, "nightly", NIGHT - timedelta(days=1, seconds=30), age=RESUME_AFTER * 2)
    results = race(4, lambda: fire_due(factory, settings, NIGHT))
    assert [(r.run_name, r.resumed) for r in results] == [("nightly-20981231T020000Z", True)]
    assert count(factory, Run) == 2 and count(factory, Firing) == 2


def _left_in_progress(factory, schedule: str, fire_time: datetime, age: timedelta) -> None:
    """The state a process leaves when it dies after inserting the firing and before finishing it."""
    touched = utcnow() - age
    with factory.begin() as s:
        schedule_id = s.scalar(select(Schedule.id).where(Schedule.name == schedule))
        s.add(Firing(schedule_id=schedule_id, fire_time=fire_time, ok=False, created_at=touched, updated_at=touched))


def test_a_firing_left_in_progress_is_finished_once_after_resume_after(fire_due, factory, settings, tmp_path):
    add_schedule(factory, "nightly", str(manifest(tmp_path)), "0 2 * * *")
    fire_time = datetime(2099, 1, 1, 2, 0, tzinfo=UTC)
    _left_in_progress(factory, "nightly", fire_time, age=timedelta(seconds=5))
    assert fire_due(factory, settings, NIGHT) == [], "a recent one is another process's, still at work"
    assert count(factory, Run) == 0 and list_schedules(factory)[0].last_firing.state == "in progress"
    with factory.begin() as s:
        s.scalar(select(Firing)).updated_at = utcnow() - RESUME_AFTER - timedelta(seconds=1)
    # Found by a tick whose own due time is later: a begun firing is finished, not dropped.
    new, resumed = fire_due(factory, settings, NIGHT + timedelta(days=1))
    assert fire_due(factory, settings, NIGHT + timedelta(days=1)) == []
    assert (new.resumed, new.ok, new.run_name) == (False, True, "nightly-20990102T020000Z")
    assert (resumed.resumed, resumed.ok, resumed.run_name) == (True, True, "nightly-20990101T020000Z")
    assert run_names(factory) == ["nightly-20990101T020000Z", "nightly-20990102T020000Z"]
    assert count(factory, Firing) == 2 and count(factory, Firing, Firing.ok.is_(True)) == 2


def test_a_run_made_before_the_crash_is_adopted_not_made_again(fire_due, factory, settings, registry, tmp_path):
    path = manifest(tmp_path)
    add_schedule(factory, "nightly", str(path), "0 2 * * *")
    spec = load_manifest(path, registry=registry, name="nightly-20990101T020000Z")
    made = submission.submit_run(factory, spec, output=f"file://{tmp_path}/out/")
    _left_in_progress(factory, "nightly", datetime(2099, 1, 1, 2, 0, tzinfo=UTC), age=RESUME_AFTER * 2)
    # Changed since: submitting again under the same name would be refused; the run that exists is the firing's.
    path.write_text(GOOD.replace("a red circle", "a green triangle"))
    (result,) = fire_due(factory, settings, NIGHT)
    assert (result.ok, result.resumed, result.run_id) == (True, True, made.run_id)
    assert count(factory, Run) == 1


def test_a_bad_manifest_is_a_failed_firing_and_other_schedules_still_fire(fire_due, factory, settings, tmp_path):
    broken, gone = manifest(tmp_path, name="broken.yaml"), manifest(tmp_path, name="gone.yaml")
    add_schedule(factory, "broken", str(broken), "0 2 * * *")
    add_schedule(factory, "gone", str(gone), "0 2 * * *")
    add_schedule(factory, "good", str(manifest(tmp_path)), "0 2 * * *")
    broken.write_text(BAD)
    gone.unlink()
    results = {r.schedule: r for r in fire_due(factory, settings, NIGHT)}
    assert results["good"].ok and run_names(factory) == ["good-20990101T020000Z"]
    assert not results["broken"].ok and results["broken"].run_id is None
    assert f"{broken}:5: videos[0].seeed: unknown field 'seeed'" in results["broken"].errors
    assert f"{broken}:6: videos[1].id: duplicate id 'a'" in results["broken"].errors
    assert not results["gone"].ok and f"{gone}: cannot be read" in results["gone"].errors
    listed = {s.name: s.last_firing for s in list_schedules(factory)}
    assert listed["broken"].state == "failed" and listed["broken"].errors == results["broken"].errors
    assert count(factory, Firing, Firing.ok.is_(False), Firing.errors.is_not(None)) == 2
    assert fire_due(factory, settings, NIGHT) == [], "a failed firing is final: the fire time is not retried"


def test_an_s3_manifest_is_checked_when_added_and_read_at_each_firing(fire_due, tmp_path, s3_env):
    bucket, s3 = s3_env, boto3.client("s3")
    uri = f"s3://{bucket}/schedules/spring.yaml"
    s3.put_object(Bucket=bucket, Key="schedules/spring.yaml", Body=GOOD.encode())
    factory = session_factory(f"sqlite:///{tmp_path / 'r.db'}")
    settings = Settings.from_env({}).with_values({"database_url": f"sqlite:///{tmp_path / 'r.db'}",
                                                  "manifest.default_output": f"file://{tmp_path}/out/"})
    with pytest.raises(UsageError, match="no such object"):
        add_schedule(factory, "spring", f"s3://{bucket}/schedules/missing.yaml", "0 2 * * *")
    assert add_schedule(factory, "spring", uri, "0 2 * * *").manifest == uri
    (result,) = fire_due(factory, settings, NIGHT)
    assert result.ok and result.run_name == "spring-20990101T020000Z"
    with factory() as s:
        assert s.get(Run, result.run_id).source == uri, "the run records the object, not a temporary copy"
    s3.put_object(Bucket=bucket, Key="schedules/spring.yaml", Body=BAD.encode())
    (failed,) = fire_due(factory, settings, NIGHT + timedelta(days=1))
    assert not failed.ok and f"{uri}:5: videos[0].seeed" in failed.errors
    s3.delete_object(Bucket=bucket, Key="schedules/spring.yaml")
    (gone,) = fire_due(factory, settings, NIGHT + timedelta(days=2))
    assert not gone.ok and gone.errors == f"manifest {uri}: no such object (S3 answered 404 NoSuchKey)"


def test_a_schedule_notify_is_checked_when_added_and_given_to_every_run(fire_due, factory, settings, tmp_path):
    hooks = settings.with_values({"manifest.allowed_webhooks": ("https://hooks.example.com/rb/",),
                                  "webhooks.secret": "s3cr3t-webhook-key-0123"})
    with pytest.raises(UsageError, match=r"--notify: 'https://evil.example.net/' is not under an allowed webhook"):
        add_schedule(factory, "n", str(manifest(tmp_path)), "0 2 * * *", notify="https://evil.example.net/",
                     settings=hooks)
    with pytest.raises(UsageError, match="REELBATCH_WEBHOOK_SECRET is not set"):
        add_schedule(factory, "n", str(manifest(tmp_path)), "0 2 * * *", notify="https://hooks.example.com/rb/x",
                     settings=hooks.with_values({"webhooks.secret": None}))
    assert list_schedules(factory) == [], "nothing written"
    info = add_schedule(factory, "n", str(manifest(tmp_path)), "0 2 * * *",
                        notify="HTTPS://hooks.example.com/rb/nightly", settings=hooks)
    assert info.notify == "https://hooks.example.com/rb/nightly"
    (fired,) = fire_due(factory, hooks, NIGHT)
    with factory() as s:
        assert s.scalar(select(Run.notify_url).where(Run.id == fired.run_id)) == "https://hooks.example.com/rb/nightly"
