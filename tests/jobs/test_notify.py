"""Webhooks when a run finishes, against a real HTTP server on loopback and the real databases (SQLite and
PostgreSQL): one accepted delivery per finish whatever races, a signature the receiver can check, every attempt
recorded, backoff and giving up on a controlled clock."""

import json
import threading
from datetime import datetime, timedelta, timezone

from sqlalchemy import func, select

from jobs.claims import claims
from jobs.db import queries, submission
from jobs.db.base import utcnow
from jobs.db.service_rows import Notification
from jobs.manifest import load_manifest
from jobs.manifest.policy import ManifestPolicy
from jobs.notify import finished, outbox, send
from jobs.notify.outbox import notifications
from jobs.notify.sign import signature, verify
from jobs.render import record
from jobs.render.record import VideoOutput
from jobs.settings import Settings
from tests.webhooks import receiver, signed_by

SECRET = "whsec_test_0123456789"


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body():
    """Worked by hand: `printf '%s' '1700000000.{"event":"run.finished"}' | openssl dgst -sha256 -hmac
    'whsec_test_0123456789'`."""
    body = b'{"event":"run.finished"}'
    header = signature(SECRET, 1700000000, body)
    assert header == "t=1700000000,v1=4a70391378cf52ef4492119d88e03e0b146680f415595f0ab77c2dc5a96904e2"
    assert verify(SECRET, header, body, now=1700000300)
    assert not verify(SECRET, header, body, now=1700000301), "older than 5 minutes: a replay"
    assert not verify(SECRET, header, body + b" ", now=1700000000), "a changed body"
    assert not verify("another-secret-0123", header, body, now=1700000000)
    assert not verify(SECRET, "v1=" + header.rpartition("v1=")[2], body, now=1700000000), "no timestamp"


def _settings(factory, **kw):
    url = factory.kw["bind"].url.render_as_string(hide_password=False)
    return Settings.from_env({}).with_values({"database_url": url, "webhooks.secret": SECRET, **kw})


def _submit(factory, tmp_path, hook, videos=2, name="n"):
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(f"name: {name}\nnotify: {hook.url}done\nvideos:\n"
                        + "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(videos)))
    spec = load_manifest(manifest, registry=_registry(), policy=ManifestPolicy(allowed_webhooks=(hook.url,)))
    return submission.submit_run(factory, spec, output=f"file://{tmp_path / 'out'}/")


def _registry():
    from engine.models.registry import Registry

    return Registry()


def _cancel_and_notice(settings, factory, name="n"):
    """Finish a run without rendering: cancel its waiting videos, then the one place that notices a finish."""
    queries.cancel_run(factory, name)
    return finished.run_finished(settings, factory, [name])


def test_a_finish_is_delivered_once_after_two_refusals_with_every_attempt_recorded(factory, tmp_path):
    with receiver([503, 503]) as hook:
        settings = _settings(factory)
        run = _submit(factory, tmp_path, hook)
        assert _cancel_and_notice(settings, factory) == ["n"]
        (first,) = notifications(factory, "n")
        assert (first.state, len(first.attempts), len(hook.received)) == ("pending", 1, 1), "tried at once"
        # The second attempt waits the first backoff, 30 s (REELBATCH_WEBHOOK_BACKOFF_S's default).
        wait = (first.next_attempt_at - first.attempts[0].started_at).total_seconds()
        assert 30 <= wait < 31
        due = first.next_attempt_at
        assert send.deliver_due(settings, factory, now=due - timedelta(seconds=1)) == [], "not due yet"
        assert send.deliver_due(settings, factory, now=due) == ["pending"]
        (second,) = notifications(factory, "n")
        assert second.next_attempt_at - due == timedelta(seconds=60), "the wait doubles"
        assert send.deliver_due(settings, factory, now=second.next_attempt_at) == ["delivered"]
        for later in (1, 3600, 90000):  # sweepers keep ticking: a delivered notification is never sent again
            assert send.deliver_due(settings, factory, now=due + timedelta(seconds=later)) == []
        assert finished.run_finished(settings, factory, ["n"]) == ["n"], "noticing the finish again opens nothing"
    assert [r.answered for r in hook.received] == [503, 503, 200]
    (done,) = notifications(factory, "n")
    assert done.state == "delivered" and done.next_attempt_at is None
    assert [(a.number, a.status_code, a.accepted) for a in done.attempts] == [(1, 503, False), (2, 503, False),
                                                                            (3, 200, True)]
    assert all(a.error == "503 Service Unavailable" for a in done.attempts[:2]) and done.attempts[2].error is None
    # The receiver's view: the same body and delivery id every time, each signed at its own moment.
    assert {r.body for r in hook.received} == {done.body.encode()}
    assert {r.headers["Reelbatch-Delivery"] for r in hook.received} == {done.key}
    assert [r.headers["Reelbatch-Attempt"] for r in hook.received] == ["1", "2", "3"]
    assert all(signed_by(SECRET, r) for r in hook.received)
    assert not signed_by("not-the-secret-0000", hook.received[2])
    assert all(r.path == "/done" and r.headers["Content-Type"] == "application/json" for r in hook.received)
    body = json.loads(done.body)
    assert body["event"] == "run.finished" and body["delivery"] == done.key
    assert body["run"] == {"id": run.run_id, "name": "n", "model": "tiny", "round": 0, "cancelled": True,
                           "source": str(tmp_path / "n.yaml"), "output": f"file://{tmp_path / 'out'}/"}
    assert (body["videos"], body["counts"]) == (2, {"pending": 0, "running": 0, "succeeded": 0, "failed": 0,
                                                    "cancelled": 2})
    assert body["cost"] == {"total_usd": 0.0, "per_successful_video_usd": None}
    assert body["results"] == {"results_uri": (tmp_path / "out" / "n" / "results.jsonl").as_uri(),
                               "errors_uri": (tmp_path / "out" / "n" / "errors.jsonl").as_uri()}
    assert len((tmp_path / "out" / "n" / "errors.jsonl").read_text().splitlines()) == 2, "the files it names exist"


def test_two_workers_finishing_the_last_videos_at_once_make_one_delivery(factory, tmp_path):
    """Each of two workers holds one of the run's two videos. They record their successes and notice the finish at
    the same moment (a barrier): both see the run finished, both write the result files, one opens the
    notification, and the receiver gets exactly one delivery. Twenty rounds, on SQLite and PostgreSQL."""
    with receiver() as hook:
        settings = _settings(factory)
        for round_ in range(20):
            name = f"race{round_}"
            _submit(factory, tmp_path, hook, name=name)
            held = [claims.claim_batch(factory, owner=f"w{i}", max_batch=1, lease_s=60).units[0] for i in range(2)]
            barrier, seen = threading.Barrier(2), []

            def finish(unit, barrier=barrier, seen=seen):
                out = VideoOutput(f"file:///x/{unit.key}.mp4", 1, "0" * 64, 0.1, 0.0, 0.0)
                barrier.wait()
                assert record.record_success(factory, unit, out, settings.prices.gpu)
                seen.append(finished.run_finished(settings, factory, [unit.run_name]))

            threads = [threading.Thread(target=finish, args=(u,)) for u in held]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert [name] in seen, "at least the later of the two saw its run finished"
            assert len([r for r in hook.received if json.loads(r.body)["run"]["name"] == name]) == 1, name
    with factory() as s:
        assert s.scalar(select(func.count()).select_from(Notification)) == 20
    assert len(hook.accepted()) == 20


def test_two_sweepers_never_send_the_same_delivery_at_once(factory, tmp_path):
    """The receiver takes half a second to answer; two sweepers reach the due notification together. One holds
    its lease and sends; the other finds nothing to send."""
    with receiver([503], delay_s=0.5) as hook:
        settings = _settings(factory)
        _submit(factory, tmp_path, hook)
        _cancel_and_notice(settings, factory)
        due = notifications(factory, "n")[0].next_attempt_at
        barrier, states = threading.Barrier(2), []

        def sweep():
            barrier.wait()
            states.append(send.deliver_due(settings, factory, now=due))

        threads = [threading.Thread(target=sweep) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(states) == [[], ["delivered"]]
    assert [r.answered for r in hook.received] == [503, 200]


def test_a_delivery_gives_up_after_24_hours_of_failures(factory, tmp_path):
    """The receiver always answers 503. On a controlled clock, attempts follow the doubling backoff from 30 s, each
    wait at most an hour: at 0, 30, 90, 210, 450, 930, 1890, 3810 s, then hourly; attempt 30 (at 83,010 s) is the
    last, since the next would come after 24 hours (86,610 > 86,400)."""
    with receiver([503] * 40) as hook:
        settings = _settings(factory)
        _submit(factory, tmp_path, hook)
        queries.cancel_run(factory, "n")
        t0 = datetime(2027, 1, 1, tzinfo=timezone.utc)
        run, _ = queries.load_report(factory, "n")
        outbox.open_notification(factory, run, "00000000-0000-4000-8000-000000000000", "{}", t0)
        times, now = [], t0
        for _ in range(40):
            states = send.deliver_due(settings, factory, now=now)
            if not states:
                break
            times.append(int((now - t0).total_seconds()))
            info = notifications(factory, "n")[0]
            if info.state != "pending":
                break
            now = info.next_attempt_at
    assert times[:9] == [0, 30, 90, 210, 450, 930, 1890, 3810, 7410]
    assert len(times) == 30 and times[-1] == 83010
    assert info.state == "gave_up" and len(info.attempts) == 30 and len(hook.received) == 30
    assert send.deliver_due(settings, factory, now=t0 + timedelta(days=3)) == [], "given up is final"


def test_a_sender_without_the_secret_sends_nothing_and_records_why(factory, tmp_path):
    with receiver() as hook:
        settings = _settings(factory).with_values({"webhooks.secret": None})
        _submit(factory, tmp_path, hook)
        _cancel_and_notice(settings, factory)
    (info,) = notifications(factory, "n")
    assert hook.received == [] and info.state == "pending"
    (attempt,) = info.attempts
    assert attempt.status_code is None and not attempt.accepted
    assert attempt.error.startswith("REELBATCH_WEBHOOK_SECRET is not set in ") and attempt.error.endswith(": not sent")


def test_a_redirect_is_refused_not_followed(factory, tmp_path):
    """A 3xx could lead outside the allowed prefixes: it is recorded as the answer and retried, never followed."""
    with receiver() as elsewhere, receiver([302], location=elsewhere.url) as hook:
        settings = _settings(factory)
        _submit(factory, tmp_path, hook)
        _cancel_and_notice(settings, factory)
        assert elsewhere.received == [] and [r.answered for r in hook.received] == [302]
    (attempt,) = notifications(factory, "n")[0].attempts
    assert (attempt.status_code, attempt.accepted, attempt.error) == (302, False, "302 Found")


def test_a_receiver_that_is_down_is_an_error_attempt(factory, tmp_path):
    with receiver() as hook:
        url = hook.url
    settings = _settings(factory)
    manifest = tmp_path / "n.yaml"
    manifest.write_text(f"name: n\nnotify: {url}\nvideos:\n  - {{id: v0, prompt: p}}\n")
    policy = ManifestPolicy(allowed_webhooks=(url,))
    submission.submit_run(factory, load_manifest(manifest, registry=_registry(), policy=policy),
                       output=f"file://{tmp_path / 'out'}/")
    _cancel_and_notice(settings, factory)
    (attempt,) = notifications(factory, "n")[0].attempts
    assert attempt.status_code is None and "Connection refused" in attempt.error


def test_a_resumed_run_that_finishes_again_is_notified_again(factory, tmp_path):
    with receiver() as hook:
        settings = _settings(factory)
        _submit(factory, tmp_path, hook)
        _cancel_and_notice(settings, factory)
        assert queries.resume_run(factory, "n")[1] == 2
        assert finished.run_finished(settings, factory, ["n"]) == [], "its videos wait again"
        _cancel_and_notice(settings, factory)
    rounds = notifications(factory, "n")
    assert [(n.round, n.state) for n in rounds] == [(0, "delivered"), (1, "delivered")]
    assert len({n.key for n in rounds}) == 2 and len(hook.accepted()) == 2
    assert [json.loads(r.body)["run"]["round"] for r in hook.received] == [0, 1]


def test_a_finish_nobody_noticed_is_caught_up_by_a_sweep(factory, tmp_path):
    """The run is cancelled but nothing noticed (a process died first): a sweeper's catch-up opens and sends it,
    once; a run without `notify` is left alone."""
    with receiver() as hook:
        settings = _settings(factory)
        _submit(factory, tmp_path, hook)
        plain = tmp_path / "plain.yaml"
        plain.write_text("name: plain\nvideos:\n  - {id: v0, prompt: p}\n")
        submission.submit_run(factory, load_manifest(plain, registry=_registry()), output=f"file://{tmp_path / 'out'}/")
        queries.cancel_run(factory, "n")
        queries.cancel_run(factory, "plain")
        assert outbox.finished_unopened(factory) == ["n"]
        assert finished.catch_up(settings, factory) == ["n"]
        assert finished.catch_up(settings, factory) == []
    assert len(hook.received) == 1 and json.loads(hook.received[0].body)["run"]["name"] == "n"
    assert (tmp_path / "out" / "n" / "results.jsonl").exists()


def test_a_notification_is_not_opened_for_a_run_still_rendering(factory, tmp_path):
    with receiver() as hook:
        settings = _settings(factory)
        _submit(factory, tmp_path, hook)
        claims.claim_batch(factory, owner="w", max_batch=1, lease_s=60)
        assert finished.run_finished(settings, factory, ["n"]) == []
        assert outbox.finished_unopened(factory) == []
        run, _ = queries.load_report(factory, "n")
        assert outbox.open_notification(factory, run, "k", "{}", utcnow()) is None, "checked again when opening"
    assert hook.received == []


def test_the_receiver_check_in_the_docs_accepts_a_real_delivery_and_nothing_else(factory, tmp_path):
    from tests.conftest import REPO

    page = (REPO / "docs" / "NOTIFICATIONS.md").read_text(encoding="utf-8")
    start = page.index("```python\n", page.index("<!-- receiver example")) + len("```python\n")
    code = page[start:page.index("```", start)]
    assert len(code.splitlines()) <= 10, "the example stays ten lines"
    scope: dict = {}
    exec(compile(code, "docs/NOTIFICATIONS.md", "exec"), scope)
    with receiver() as hook:
        _submit(factory, tmp_path, hook)
        _cancel_and_notice(_settings(factory), factory)
    (got,) = hook.received
    header = got.headers["Reelbatch-Signature"]
    assert scope["verify"](SECRET, header, got.body)
    assert not scope["verify"](SECRET, header, got.body.replace(b'"cancelled":2', b'"cancelled":3'))
    assert not scope["verify"]("some-other-secret-0", header, got.body)
    stale = "t=1700000000," + header.split(",")[1]
    assert not scope["verify"](SECRET, stale, got.body)
