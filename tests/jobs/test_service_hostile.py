"""`reelbatch serve` tried as a hostile team would, on loopback with real clients (httpx, a raw socket): it cannot
choose where on the server its files go, send a body before it has shown a token, reach a run by an id out of range
or hide another team's run behind a name of digits, slip a bad budget past the checks, or get a token into the log
by putting it in the URL; and a restarted server keeps nothing a killed one left mid-upload."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest

from tests.jobs.service_server import Service, embedded_env, free_port

YAML = {"content-type": "application/yaml"}
ONE = "name: one\nmodel: tiny\ndefaults: {steps: 2}\nvideos:\n  - {id: a, prompt: one}\n  - {id: b, prompt: two}\n"
BIG_IDS = ("9223372036854775808", "1" + "0" * 30)  # 2^63, the first id past a signed 64-bit column; and 10^30


@pytest.fixture(scope="module")
def service(tmp_path_factory, model_cache):
    svc = Service(tmp_path_factory.mktemp("hostile"), embedded_env(model_cache))
    yield svc
    svc.stop()


def rows(svc: Service) -> dict[str, int]:
    with sqlite3.connect(svc.cwd / "reelbatch.db") as db:
        return {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("runs", "videos", "work_units")}


def test_a_team_writes_only_under_its_own_output_root(service):
    ads = service.client(service.team("ads"))
    service.team("clips")
    elsewhere = f"/tmp/reelbatch-hostile-{uuid.uuid4().hex[:8]}/"
    before = rows(service)
    own = f"file://{service.cwd}/outputs/ads/"
    for output, said in ((f"file://{elsewhere}", f"output 'file://{elsewhere}' is not under your team's output "
                                                 f"root {own}"),
                         (f"file://{service.cwd}/outputs/ads/../clips/",
                          "output: must be plain folder names after the start (no empty, '.' or '..' part)"),
                         (f"file://{service.cwd}/outputs/", "is not under your team's output root"),
                         ("file://../../../../root/", "is not under your team's output root"),
                         ("s3://someone-elses-bucket/", "is not under your team's output root")):
        for route in ("/v1/runs", "/v1/estimate"):
            answer = ads.post(route, content=ONE, headers=YAML, params={"output": output})
            assert answer.status_code == 400, (route, output, answer.text)
            assert said in answer.json()["detail"], (route, output, answer.text)
    for name, said in ((".ssh", "run name '.ssh' starts with '.'"), ("1", "run name '1' is all digits")):
        answer = ads.post("/v1/runs", content=ONE, headers=YAML, params={"name": name})
        assert answer.status_code == 400 and said in answer.json()["detail"], answer.text
    # The manifest's own `output:` is held to the same root: a manifest error, at its line.
    answer = ads.post("/v1/runs", content=ONE.replace("model: tiny\n", f"model: tiny\noutput: file://{elsewhere}\n"),
                      headers=YAML)
    assert answer.status_code == 422 and answer.json()["issues"][0]["line"] == 3, answer.text
    assert answer.json()["issues"][0]["field"] == "output" and own in answer.json()["issues"][0]["message"]
    assert rows(service) == before
    assert not os.path.exists(elsewhere) and not (service.cwd / "outputs" / "clips" / "one").exists()
    # Under its own root: recorded, its output the one asked for.
    answer = ads.post("/v1/runs", content=ONE, headers=YAML, params={"output": own + "spring/", "name": "mine"})
    assert answer.status_code == 201, answer.text
    with sqlite3.connect(service.cwd / "reelbatch.db") as db:
        assert db.execute("SELECT output FROM runs WHERE name = 'mine'").fetchone() == (own + "spring/",)


def test_serve_refuses_to_start_while_a_team_could_write_anywhere(tmp_path, model_cache):
    env = {k: v for k, v in embedded_env(model_cache).items() if k != "REELBATCH_ALLOWED_OUTPUTS"}

    def serve(**more: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jobs", "serve", "--port", str(free_port())], cwd=tmp_path,
                              env={**env, **more}, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)

    def cli(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "jobs", *args], cwd=tmp_path, env=env, check=True,
                       capture_output=True, timeout=120)

    cli("db", "upgrade")
    unset = serve()
    assert unset.returncode == 2 and unset.stdout == ""
    assert unset.stderr.startswith("reelbatch serve: refusing to start: ") and "REELBATCH_ALLOWED_OUTPUTS" in \
        unset.stderr and len(unset.stderr.strip().splitlines()) == 1, unset.stderr
    cli("team", "add", "ads", "--output", "file:///srv/elsewhere/")
    outside = serve(REELBATCH_ALLOWED_OUTPUTS=f"file://{tmp_path}/outputs/")
    assert outside.returncode == 2 and len(outside.stderr.strip().splitlines()) == 1, outside.stderr
    assert "ads" in outside.stderr and "file:///srv/elsewhere/" in outside.stderr, outside.stderr


def test_a_body_without_a_token_is_answered_401_before_it_is_sent(service):
    """The headers of a 16 MiB upload and not one byte of its body: the 401 comes at once, so nothing was read."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as conn:
        conn.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/yaml\r\n"
                     b"Content-Length: 16777216\r\n\r\n")
        started = time.perf_counter()
        answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
        assert time.perf_counter() - started < 5


def test_an_id_out_of_range_is_no_run_and_digits_are_always_an_id(service):
    ads, clips = service.client(service.team("ids-a")), service.client(service.team("ids-b"))
    made = ads.post("/v1/runs", content=ONE.replace("name: one", "name: by-id"), headers=YAML)
    assert made.status_code == 201
    run_id = made.json()["run_id"]
    routes = [(m, p) for p, ops in service.client(None).get("/openapi.json").json()["paths"].items()
              if "{run}" in p for m in ops]
    assert len(routes) == 10  # status, report, results, errors, videos, an MP4, a poster, cancel, resume, budget
    for big in BIG_IDS:
        for method, path in routes:
            url = path.replace("{run}", big).replace("{video}", "a")
            answer = ads.request(method.upper(), url, json={"max_cost_usd": 5} if path.endswith("budget") else None)
            assert answer.status_code == 404, (method, url, answer.status_code, answer.text)
            assert answer.json() == {"detail": f"no run named or numbered {big!r}"}
    # Team B cannot name a run "<A's id>", so /v1/runs/<id> is A's run for A and no run for B.
    refused = clips.post("/v1/runs", content=ONE, headers=YAML, params={"name": str(run_id)})
    assert refused.status_code == 400
    assert ads.get(f"/v1/runs/{run_id}").json()["name"] == "by-id"
    assert clips.get(f"/v1/runs/{run_id}").status_code == 404


@pytest.mark.parametrize("body", ['{"max_cost_usd": true}', '{"max_cost_usd": "0x10"}', '{"max_cost_usd": "5"}',
                                  '{"max_cost_usd": -1}', '{"max_cost_usd": NaN}', '{"max_cost_usd": 1e400}', '{}'])
def test_a_budget_is_a_number_or_none_and_nothing_else(service, body):
    c = service.client(service.team("budgets"))
    c.post("/v1/runs", content=ONE.replace("name: one", "name: capped"), headers=YAML)
    answer = c.put("/v1/runs/capped/budget", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, (body, answer.text)
    assert c.get("/v1/runs/capped").json()["max_cost_usd"] is None
    assert c.put("/v1/runs/capped/budget", json={"max_cost_usd": 16}).status_code == 200
    assert c.get("/v1/runs/capped").json()["max_cost_usd"] == 16.0
    assert c.put("/v1/runs/capped/budget", json={"max_cost_usd": "none"}).status_code == 200
    assert c.get("/v1/runs/capped").json()["max_cost_usd"] is None


def test_a_token_put_in_the_url_never_reaches_the_log(service):
    secret = service.team("leaky")
    c, bare = service.client(secret), service.client(None)
    answers = [bare.get("/v1/runs", params={"token": secret}), bare.get(f"/v1/runs/{secret}"),
               c.get("/v1/runs", params={"access_token": secret}), c.get(f"/v1/runs/{secret}/report"),
               c.get(f"/v1/runs?{secret}")]
    assert [a.status_code for a in answers] == [401, 401, 422, 404, 422]
    time.sleep(0.5)  # the access log's lines are flushed as written; give the last one a moment
    log = service.log.read_text()
    assert "GET /v1/runs?token=[hidden]" in log and "GET /v1/runs/[hidden]/report" in log
    assert secret not in log and secret[3:] not in log


def test_a_restarted_server_keeps_nothing_a_killed_one_left_mid_upload(tmp_path, model_cache):
    svc = Service(tmp_path, embedded_env(model_cache))
    uploads = model_cache / "uploads" / str(svc.port)
    assert uploads.is_dir() and list(uploads.iterdir()) == []
    # What a server killed while reading an upload leaves: its request's private folder, with the manifest in it.
    left = uploads / "upload-killed"
    left.mkdir()
    (left / "manifest.yaml").write_text(ONE)
    os.killpg(svc.proc.pid, 9)
    svc.proc.wait()
    try:
        svc.start()  # the same port, so the same upload folder
        assert not left.exists() and list(uploads.iterdir()) == []
    finally:
        svc.stop()
