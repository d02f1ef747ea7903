"""`reelbatch serve` against a real HTTP client on loopback: two teams submit, poll, fetch and cancel, and neither
can reach the other's runs by any route; a bad token, a body too large, a bad manifest and a burst of submissions
are refused with nothing recorded; a token's secret is never logged, never sent back, never stored in clear."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from tests.jobs.service_server import Service, embedded_env

YAML = {"content-type": "application/yaml"}
ONE = "name: one\nmodel: tiny\ndefaults: {steps: 2}\nvideos:\n  - {id: a, prompt: one}\n  - {id: b, prompt: two}\n"
JSONL = '{"id": "x", "prompt": "first", "steps": 2}\n{"id": "y", "prompt": "second", "steps": 2}\n'
BAD = "name: bad\nmodel: nope\nvideos:\n  - {id: a, prompt: one, steps: 0}\n"


@pytest.fixture(scope="module")
def service(tmp_path_factory, model_cache):
    cwd = tmp_path_factory.mktemp("serve")
    svc = Service(cwd, embedded_env(model_cache), "--max-body-bytes", "2000", "--submits-per-minute", "4",
                  "--estimates-per-minute", "2", "--changes-per-minute", "9")
    yield svc
    svc.stop()


def rows(svc: Service) -> dict[str, int]:
    with sqlite3.connect(svc.cwd / "reelbatch.db") as db:
        return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("runs", "videos", "work_units")}


def broker_messages(svc: Service) -> int:
    """Messages in the embedded broker (kombu's SQLAlchemy transport keeps each in kombu_message)."""
    with sqlite3.connect(svc.cwd / "reelbatch-broker.db") as db:
        return db.execute("SELECT count(*) FROM kombu_message").fetchone()[0]


def test_two_teams_submit_poll_fetch_cancel_and_never_meet(service):
    a, b = service.client(service.team("ads")), service.client(service.team("clips"))
    first = a.post("/v1/runs", content=ONE, headers=YAML)
    assert first.status_code == 201
    assert first.json() == {"run_id": first.json()["run_id"], "name": "one", "videos": 2, "created": True,
                            "pending": 2, "queued": True}
    assert broker_messages(service) == 2  # a ticket per pending unit, in the broker's own table
    again = a.post("/v1/runs", content=ONE, headers=YAML)  # idempotent, as `submit`
    assert again.status_code == 200 and again.json() == {**first.json(), "created": False}
    assert broker_messages(service) == 2  # an unchanged resubmission is a lookup: nothing more queued
    # Team B uploads a JSONL file: its run is named by the file's stem, as on the CLI.
    theirs = b.post("/v1/runs", files={"manifest": ("clips-1.jsonl", JSONL)})
    assert theirs.status_code == 201 and theirs.json()["name"] == "clips-1" and theirs.json()["videos"] == 2
    run_a, run_b = first.json()["run_id"], theirs.json()["run_id"]

    assert [r["name"] for r in a.get("/v1/runs").json()["runs"]] == ["one"]
    assert [r["name"] for r in b.get("/v1/runs").json()["runs"]] == ["clips-1"]
    status = a.get("/v1/runs/one").json()
    assert status["run_id"] == run_a and status["total"] == 2
    assert status["counts"] == {"pending": 2, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0}
    assert a.get(f"/v1/runs/{run_a}").json()["name"] == "one"  # by id too
    report = a.get("/v1/runs/one/report").json()
    # The CLI's JSON, with how many entries the bound (1,000 by default) left off.
    assert report == {**json.loads(service.cli("report", "one", "--json")), "videos_omitted": 0}
    lines = [json.loads(line) for line in a.get("/v1/runs/one/results.jsonl").text.splitlines()]
    assert [(r["id"], r["status"]) for r in lines] == [("a", "pending"), ("b", "pending")]

    # A page of the run's videos at a time, in the order submitted: two pages of one, then none.
    page = a.get("/v1/runs/one/videos", params={"limit": 1}).json()
    assert [v["id"] for v in page["videos"]] == ["a"] and page["next"] == page["videos"][0]["row"]
    rest = a.get("/v1/runs/one/videos", params={"limit": 1, "after": page["next"]}).json()
    assert [v["id"] for v in rest["videos"]] == ["b"] and rest["next"] is None
    assert [v["id"] for v in a.get("/v1/runs/one/videos", params={"status": ["pending", "failed"]}).json()
            ["videos"]] == ["a", "b"]
    assert a.get("/v1/runs/one/videos", params={"status": "failed"}).json() == {"videos": [], "next": None}
    assert a.get("/v1/runs/one/videos", params={"flagged": "true"}).json() == {"videos": [], "next": None}
    assert len(a.get("/v1/runs/one/videos", params={"flagged": "false"}).json()["videos"]) == 2
    assert a.get("/v1/runs/one/videos", params={"status": "lost"}).status_code == 422
    assert a.get("/v1/runs/one/videos", params={"limit": 501}).status_code == 422
    typo = a.get("/v1/runs/one/report", params={"entires": 0})  # a query parameter the route does not take
    assert typo.status_code == 422 and typo.json()["issues"][0]["text"] == (
        "query.entires: unknown query parameter (this route takes: entries)")
    # A report's entries are bounded: the first `entries`, and how many more the video pages hold.
    bounded = a.get("/v1/runs/one/report", params={"entries": 1}).json()
    assert [v["id"] for v in bounded["videos"]] == ["a"] and bounded["videos_omitted"] == 1
    assert a.get("/v1/runs/one/report").json()["videos_omitted"] == 0

    # Team A tries every route on team B's run, by name and by id: each is 404, as a run that does not exist.
    before = b.get("/v1/runs/clips-1").json()
    for run in ("clips-1", str(run_b)):
        for method, path, body in [("GET", "", None), ("GET", "/report", None), ("GET", "/results.jsonl", None),
                                   ("GET", "/errors.jsonl", None), ("GET", "/videos/x.mp4", None),
                                   ("GET", "/videos/x/poster.jpg", None), ("GET", "/videos", None),
                                   ("POST", "/cancel", None),
                                   ("POST", "/resume", None), ("PUT", "/budget", {"max_cost_usd": 0.01})]:
            answer = a.request(method, f"/v1/runs/{run}{path}", json=body)
            assert answer.status_code == 404, (method, path, answer.text)
            assert answer.json() == {"detail": f"no run named or numbered {run!r}"}, "the same words as no run"
    assert a.get("/v1/runs/nothing-here").json() == {"detail": "no run named or numbered 'nothing-here'"}
    assert b.get("/v1/runs/clips-1").json() == before, "nothing of B's run changed"
    # Nor can A take B's run name: refused without a word of B's run.
    taken = a.post("/v1/runs", content=JSONL, headers={"content-type": "application/jsonl"},
                   params={"name": "clips-1"})
    assert taken.status_code == 409 and "clips" not in taken.json()["detail"].replace("'clips-1'", "")

    # A sets a budget, cancels its run; B's stays pending.
    budget = a.put("/v1/runs/one/budget", json={"max_cost_usd": 2.5}).json()
    assert budget == {"name": "one", "max_cost_usd": 2.5, "charged_usd": 0.0, "requeued": 0}
    assert a.post("/v1/runs/one/cancel").json() == {"name": "one", "cancelled": 2}
    status = a.get("/v1/runs/one").json()
    assert status["counts"]["cancelled"] == 2 and status["max_cost_usd"] == 2.5
    errors = [json.loads(line) for line in a.get("/v1/runs/one/errors.jsonl").text.splitlines()]
    assert [(e["id"], e["code"]) for e in errors] == [("a", "cancelled"), ("b", "cancelled")]
    assert b.get("/v1/runs/clips-1").json()["counts"]["pending"] == 2
    assert a.post("/v1/runs/one/resume").json() == {"name": "one", "requeued": 2}
    # The CLI's runs belong to the default team; no API team sees them.
    (service.cwd / "cli.yaml").write_text(ONE.replace("name: one", "name: from-cli"))
    service.cli("submit", "cli.yaml")
    assert [r["name"] for r in a.get("/v1/runs").json()["runs"]] == ["one"]
    assert a.get("/v1/runs/from-cli").status_code == 404


def test_refused_requests_record_nothing(service):
    token = service.team("burst")
    c = service.client(token)
    before = rows(service)
    # 401: no token, a malformed header, an unknown token, a revoked one.
    for headers in ({}, {"Authorization": token}, {"Authorization": "Bearer rb_unknown"}):
        answer = service.client(None).post("/v1/runs", content=ONE, headers={**YAML, **headers})
        assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
    revoked = service.team("gone")
    (token_id,) = [t["id"] for t in json.loads(service.cli("token", "list", "--json"))["tokens"] if t["team"] == "gone"]
    service.cli("token", "revoke", str(token_id))
    assert service.client(revoked).post("/v1/runs", content=ONE, headers=YAML).status_code == 401
    assert service.client(revoked).get("/v1/runs").status_code == 401
    # 413: over the configured 2,000 bytes, with a length and sent in chunks without one.
    big = ONE + "".join(f"  - {{id: v{i}, prompt: more}}\n" for i in range(100))
    assert c.post("/v1/runs", content=big, headers=YAML).status_code == 413
    assert c.post("/v1/runs", content=iter([big.encode()[:1500], big.encode()[1500:]]), headers=YAML).status_code == 413
    # 422: every FILE:LINE message, exactly as `reelbatch submit` prints them for the same file.
    answer = c.post("/v1/runs", files={"manifest": ("bad.yaml", BAD)})
    assert answer.status_code == 422
    (service.cwd / "bad.yaml").write_text(BAD)
    cli = subprocess.run([sys.executable, "-m", "jobs", "submit", "bad.yaml"], cwd=service.cwd, env=service.env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2
    assert [i["text"] for i in answer.json()["issues"]] == cli.stderr.strip().splitlines()
    assert answer.json()["issues"][0] == {"file": "bad.yaml", "line": 2, "field": "model", "text": (
        "bad.yaml:2: model: 'nope' is not registered (registered: tiny, tiny-i2v, toy, toy-fast, toy-i2v)"),
        "message": "'nope' is not registered (registered: tiny, tiny-i2v, toy, toy-fast, toy-i2v)"}
    assert c.post("/v1/runs", content="name: x\n", headers={"content-type": "text/plain"}).status_code == 415
    assert rows(service) == before
    # 429: the fifth submission within a minute (the 422 above was the first), with when to retry.
    for n in range(3):
        assert c.post("/v1/runs", content=ONE.replace("one", f"burst-{n}"), headers=YAML).status_code == 201
    after = rows(service)
    refused = c.post("/v1/runs", content=ONE.replace("one", "burst-3"), headers=YAML)
    assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60
    assert rows(service) == after and after["runs"] == before["runs"] + 3
    # Estimating is not submitting, and records nothing.
    estimate = c.post("/v1/estimate", content=ONE.replace("one", "guess"), headers=YAML, params={"gpus": 2})
    assert estimate.status_code == 200 and estimate.json()["videos"] == 2 and estimate.json()["gpus"] == 2
    assert rows(service) == after
    # Estimates have their own limit (2 a minute here): the third is 429, naming the option that sets it.
    assert c.post("/v1/estimate", content=ONE, headers=YAML).status_code == 200
    refused = c.post("/v1/estimate", content=ONE, headers=YAML)
    assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.json()["detail"].startswith("team burst: over 2 estimates a minute (serve --estimates-per-minute)")
    # Changes (cancel, resume, budget) too, 9 a minute here, a refused one (404) counted as one asked: the tenth, a
    # cancel of a run of its own, is 429 and cancels nothing.
    for n in range(9):
        assert c.post(f"/v1/runs/no-run-{n}/cancel").status_code == 404
    refused = c.post("/v1/runs/burst-0/cancel")
    assert refused.status_code == 429 and "over 9 changes a minute (serve --changes-per-minute)" in refused.text
    assert c.get("/v1/runs/burst-0").json()["counts"]["pending"] == 2
    assert c.get("/v1/runs").status_code == 200, "reading is not limited"


def test_a_secret_is_never_logged_sent_back_or_stored(service):
    secret = service.team("vault")
    c = service.client(secret)
    answers = [c.post("/v1/runs", content=ONE.replace("one", "secret-run"), headers=YAML), c.get("/v1/runs"),
               c.get("/v1/runs/secret-run/report"), c.get("/v1/runs/secret-run/results.jsonl"),
               c.post("/v1/runs", files={"manifest": ("bad.yaml", BAD)}), c.get("/openapi.json"), c.get("/")]
    assert [a.status_code for a in answers] == [201, 200, 200, 200, 422, 200, 200]
    assert not any(secret in a.text or secret in str(a.headers) for a in answers)
    assert secret not in service.log.read_text() and secret not in service.cli("token", "list")
    db = b"".join(p.read_bytes() for p in service.cwd.glob("reelbatch.db*"))
    assert secret.encode() not in db
    with sqlite3.connect(service.cwd / "reelbatch.db") as conn:
        stored = {h for (h,) in conn.execute("SELECT secret_sha256 FROM tokens")}
    import hashlib

    assert hashlib.sha256(secret.encode()).hexdigest() in stored


def test_the_openapi_description_lists_every_route(service):
    paths = service.client(None).get("/openapi.json").json()["paths"]
    assert set(paths) == {"/v1/runs", "/v1/estimate", "/v1/runs/{run}", "/v1/runs/{run}/report",
                          "/v1/runs/{run}/results.jsonl", "/v1/runs/{run}/errors.jsonl", "/v1/runs/{run}/cancel",
                          "/v1/runs/{run}/resume", "/v1/runs/{run}/budget", "/v1/runs/{run}/videos",
                          "/v1/runs/{run}/videos/{video}.mp4",
                          "/v1/runs/{run}/videos/{video}/poster.jpg"}


def test_a_video_in_s3_is_a_redirect_to_a_short_lived_presigned_url(tmp_path, model_cache, s3_env):
    import os

    import httpx

    from storage.stores import open_store

    aws = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    svc = Service(tmp_path, {**embedded_env(model_cache), **aws,
                             "REELBATCH_ALLOWED_OUTPUTS": f"file://{tmp_path}/outputs/,s3://{s3_env}/"})
    try:
        ours = svc.client(svc.team("ads", "--output", f"s3://{s3_env}/out/"))
        theirs = svc.client(svc.team("clips"))
        answer = ours.post("/v1/runs", content=ONE, headers=YAML, params={"output": f"s3://{s3_env}/out/"})
        assert answer.status_code == 201, answer.text
        # What a worker records for video a (its MP4 and poster stored, their URIs on the row), without rendering.
        store = open_store(f"s3://{s3_env}/out/")
        mp4, jpeg = b"not really an mp4", b"\xff\xd8\xff not really a jpeg"
        uri = store.replace("one/a.mp4", mp4, content_type="video/mp4")
        poster = store.replace("one/a.jpg", jpeg, content_type="image/jpeg")
        with sqlite3.connect(svc.cwd / "reelbatch.db") as db:
            db.execute("UPDATE videos SET uri = ?, poster_uri = ? WHERE key = 'a'", (uri, poster))
        for path, body in (("/v1/runs/one/videos/a.mp4", mp4), ("/v1/runs/one/videos/a/poster.jpg", jpeg)):
            moved = ours.get(path, follow_redirects=False)
            assert moved.status_code == 307
            signed = moved.headers["location"]
            assert signed.startswith(f"{os.environ['AWS_ENDPOINT_URL']}/{s3_env}/out/one/a.")
            assert "X-Amz-Expires=300" in signed and "X-Amz-Signature=" in signed
            assert httpx.get(signed).content == body, "the URL alone fetches the object: no token, no credentials"
            assert theirs.get(path, follow_redirects=False).status_code == 404
        assert ours.get("/v1/runs/one/videos/b.mp4", follow_redirects=False).status_code == 404, "not stored yet"
    finally:
        svc.stop()


def test_team_and_token_commands_refuse_bad_input_with_exit_2(service):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=service.cwd, env=service.env, text=True,
                              capture_output=True, timeout=120)

    for args, message in [
        (("team", "add", "Big Team"), "team name 'Big Team': use 1-64 lower-case letters, digits, '-' or '_', "
                                      "starting with a letter or digit\n"),
        (("team", "add", "ok", "--share", "0"), "--share 0.0: must be above 0\n"),
        (("token", "create", "--team", "nobody"), "--team 'nobody': no such team (see `reelbatch team list`)\n"),
        (("token", "revoke", "9999"), "no token 9999 (see `reelbatch token list`)\n"),
    ]:
        proc = run(*args)
        assert (proc.returncode, proc.stderr) == (2, message), args
    before = json.loads(service.cli("team", "list", "--json"))["teams"]
    assert "ok" not in [t["name"] for t in before], "nothing written"
    service.cli("team", "add", "ads", "--share", "2", "--max-gpus", "4", "--monthly-usd", "100")  # changes ads
    (ads,) = [t for t in json.loads(service.cli("team", "list", "--json"))["teams"] if t["name"] == "ads"]
    assert (ads["share"], ads["max_gpus"], ads["monthly_usd"]) == (2.0, 4, 100.0)


def test_a_teams_run_list_comes_a_page_at_a_time_newest_page_first(service):
    c = service.client(service.team("pages"))
    ids = {}
    for name in ("p1", "p2", "p3"):
        answer = c.post("/v1/runs", files={"manifest": (f"{name}.jsonl", JSONL)})
        assert answer.status_code == 201, answer.text
        ids[name] = answer.json()["run_id"]
    newest = c.get("/v1/runs", params={"limit": 2}).json()
    assert [r["name"] for r in newest["runs"]] == ["p2", "p3"] and newest["next_before"] == ids["p2"]
    older = c.get("/v1/runs", params={"limit": 2, "before": newest["next_before"]}).json()
    assert [r["name"] for r in older["runs"]] == ["p1"] and older["next_before"] is None
    whole = c.get("/v1/runs").json()  # the default page of 100 holds all three
    assert [r["name"] for r in whole["runs"]] == ["p1", "p2", "p3"] and whole["next_before"] is None
    for bad in ({"limit": 0}, {"limit": 1001}, {"before": 2**63}, {"before": "x"}):
        assert c.get("/v1/runs", params=bad).status_code == 422, bad
