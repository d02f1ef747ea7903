"""`reelbatch run` end to end, as a user runs it: real CLI process, real Celery worker, real store, MP4s decoded."""

import hashlib
import json
import os
import re
import sqlite3
import subprocess

import boto3
import pytest
import yaml

from storage.encode import decode_frames, probe_mp4
from toyworld.judge import judge_clip

from .conftest import DEMO, Cli, base_env
from .demo_bytes import DEMO_GREEN_AVX2, DEMO_SHA256, conv_kernel, cpu_has_avx512, machine_kind

# What the judge reads from each demo video. The shipped toy model gets the shape right in 84% of its quality set
# (its card), and the demo's blue square comes out round. The green square is striped with yellow: its median colour
# is 18.0 in CIELAB from the palette's green, over the judge's 16 for another shade (toyworld/judge.py; looked at
# beside a swatch of that green, it reads yellow-green in bands). Every other attribute of every video is right.
DEMO_JUDGED = {"red-circle-left": {"colour": True, "shape": True, "direction": True, "background": True},
               "blue-square-up": {"colour": True, "shape": False, "direction": True, "background": True},
               "yellow-circle-right": {"colour": True, "shape": True, "direction": True, "background": True},
               "green-square-down": {"colour": False, "shape": True, "direction": True, "background": True}}


def video_sha(folder, video: str) -> str:
    return hashlib.sha256((folder / "outputs" / "demo" / f"{video}.mp4").read_bytes()).hexdigest()[:12]


def check_videos(report: dict, read_bytes) -> None:
    assert report["videos"], "the demo has videos"
    for v in report["videos"]:
        assert v["status"] == "succeeded", v
        data = read_bytes(v["uri"])
        assert len(data) == v["bytes"] and hashlib.sha256(data).hexdigest() == v["sha256"]
        info = probe_mp4(data)
        assert (info.frames, info.width, info.height) == (v["frames"], v["width"], v["height"])
        assert info.fps == pytest.approx(v["fps"]) and info.codec == "h264" and info.pix_fmt == "yuv420p"
        assert v["frames"] % 4 == 1 and v["duration_s"] == pytest.approx(v["frames"] / v["fps"])
        assert 0 <= v["seed"] < 2**63 and v["cost_usd"] > 0
    per = report["cost"]["per_successful_video_usd"]
    assert per == pytest.approx(report["cost"]["total_with_idle_usd"] / len(report["videos"]))
    assert report["cost"]["total_with_idle_usd"] == pytest.approx(report["cost"]["total_usd"]
                                                                   + report["cost"]["idle_usd"])


@pytest.fixture(scope="module")
def demo(tmp_path_factory, model_cache) -> tuple[Cli, subprocess.CompletedProcess]:
    """`reelbatch run` of the demo, once for the module, in a folder of its own: the CLI there and the run's output.
    The tests that read it leave the folder as they found it (an MP4 moved aside is put back)."""
    folder = tmp_path_factory.mktemp("demo")
    cli = Cli(folder, base_env(model_cache))
    return cli, cli("run", str(DEMO))


def test_run_demo_to_a_local_folder(demo):
    cli, proc = demo
    tmp_path = cli.cwd
    assert "succeeded" in proc.stdout
    report = cli.json("report", "demo")
    assert report["output"] == f"file://{tmp_path / 'outputs'}/"
    for v in report["videos"]:
        assert v["uri"] == f"file://{tmp_path / 'outputs' / 'demo' / v['id']}.mp4"
        assert probe_mp4(tmp_path / "outputs" / "demo" / f"{v['id']}.mp4").moov_first
    check_videos(report, lambda uri: open(uri[len("file://"):], "rb").read())
    machine = machine_kind(cli.env)
    if machine in DEMO_SHA256:  # another machine's bytes are not known: the runs below still compare with this one
        assert {v["id"]: v["sha256"][:12] for v in report["videos"]} == DEMO_SHA256[machine], machine
    results = [json.loads(line) for line in (tmp_path / "outputs" / "demo" / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["uri"], r["sha256"]) for r in results] == \
        [(v["id"], v["uri"], v["sha256"]) for v in report["videos"]]
    assert (tmp_path / "outputs" / "demo" / "errors.jsonl").read_text() == ""
    assert report["throughput"]["videos_per_hour"] > 0 and report["render_latency_s"]["p50"] > 0
    assert report["gross_margin"]["gross_margin"] < 1 and report["cost"]["per_video_second_usd"] > 0
    # The embedded worker's session, closed when it stopped: charged + idle = its up time x rate, to the cent.
    ledger = cli.json("ledger")
    (session,) = ledger["sessions"]
    assert session["state"] == "stopped" and 0 < session["charged_s"] < session["up_s"] and session["idle_s"] > 0
    assert abs(session["charged_micro_usd"] + session["idle_micro_usd"] - session["total_micro_usd"]) < 10_000
    assert session["runs"] == {str(report["run_id"]): len(report["videos"])}
    # The run's idle share: the session's idle seconds before its last work (it served this run alone); the idle
    # after it (the worker shutting down) is the ledger's, not the run's.
    assert 0 < session["spread_micro_usd"] <= session["idle_micro_usd"]
    assert report["cost"]["idle_usd"] == pytest.approx(session["spread_micro_usd"] / 1e6)
    assert "charged to videos" in cli("ledger").stdout
    plan = cli.json("capacity", "--run", "demo", "--gpus", "8")
    ceiling, sustainable, budget = plan["levels"]
    assert ceiling["videos_per_day"] >= sustainable["videos_per_day"] > budget["videos_per_day"] > 0
    assert plan["assumptions"]["gpu_hour_source"] and plan["assumptions"]["price_source"]
    assert plan["assumptions"]["utilisation_source"].startswith("worker sessions")
    assert plan["assumptions"]["measured_utilisation"] == pytest.approx(session["charged_s"] / session["up_s"])
    assert "ceiling" in cli("capacity", "--run", "demo").stdout
    status = cli.json("status")
    (run,) = status["runs"]
    assert run["name"] == "demo" and run["counts"]["succeeded"] == len(report["videos"])
    # Running the same manifest again is idempotent: same run, nothing re-rendered, the same bytes.
    again = cli.json("run", str(DEMO))
    assert again["run_id"] == report["run_id"] and again["videos"] == report["videos"]
    # The demo renders the trained toy model: what a viewer sees is the shape, colour and motion the prompt asked for.
    for v in report["videos"]:
        verdict = judge_clip(decode_frames((tmp_path / "outputs" / "demo" / f"{v['id']}.mp4").read_bytes()))
        assert verdict.matches(v["prompt"]) == DEMO_JUDGED[v["id"]], (v["id"], verdict)


def test_the_demo_renders_the_same_bytes_on_one_thread_or_three(cli, tmp_path):
    """`green-square-down`, a batch of one, is the video whose bytes followed MKL's thread count and vector width: on
    one machine, one thread and three give the same bytes; held to oneDNN's AVX2 code it gives that code's bytes on
    a machine whose bytes are known (on a CPU without AVX-512 the setting changes nothing)."""
    demo = yaml.safe_load(DEMO.read_text())
    demo["videos"] = [v for v in demo["videos"] if v["id"] == "green-square-down"]  # the seed: from run name and id
    rendered = {}
    for label, env in (("1", {"OMP_NUM_THREADS": "1"}), ("3", {"OMP_NUM_THREADS": "3"}),
                       ("avx2", {"OMP_NUM_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"})):
        folder = tmp_path / f"threads-{label}"
        folder.mkdir()
        (folder / "demo.yaml").write_text(yaml.safe_dump(demo))
        Cli(folder, {**cli.env, **env})("run", "demo.yaml")
        rendered[label] = video_sha(folder, "green-square-down")
    assert rendered["1"] == rendered["3"], rendered
    assert conv_kernel({**cli.env, "ONEDNN_MAX_CPU_ISA": "AVX2"}) == "jit:avx2"
    machine = machine_kind(cli.env)
    if machine in DEMO_GREEN_AVX2:
        assert rendered["1"] == DEMO_SHA256[machine]["green-square-down"], rendered
        assert rendered["avx2"] == DEMO_GREEN_AVX2[machine], rendered
    if not cpu_has_avx512():
        assert rendered["avx2"] == rendered["1"], rendered


def test_the_html_report_renders_offline_in_a_real_browser(demo, tmp_path, chromium):
    """The demo's report as one HTML file, opened by headless Chromium with no network: the page's own check finds
    every contact-sheet image decoded (each video's stored poster, 4 JPEGs; no MP4 is decoded: they are moved away
    first, and back after), no script error is recorded, and nothing is fetched."""
    cli = demo[0]
    aside = tmp_path / "aside"
    aside.mkdir()
    mp4s = sorted((cli.cwd / "outputs" / "demo").glob("*.mp4"))
    assert len(mp4s) == 4
    page = tmp_path / "report.html"
    try:
        for mp4 in mp4s:
            mp4.rename(aside / mp4.name)
        cli("report", "demo", "--html", str(page))
    finally:
        for mp4 in mp4s:
            (aside / mp4.name).rename(mp4)
    text = page.read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text, "the report must open offline"
    assert text.count("data:image/jpeg;base64,") == 4 and "image/png" not in text
    assert text.count("<svg") == 4 and "a red circle moving left" in text  # throughput, latency, stage and charge charts
    assert "Cost by charge" in text and "idle worker time" in text
    proc = subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body is not None, proc.stdout[:2000]
    assert 'data-rendered="ok:4"' in body.group(0) and "data-errors" not in body.group(0), body.group(0)


def test_run_jsonl_with_run_level_options(cli, tmp_path):
    # The demo's lines without their own steps (20, the toy model's), so that the run's --set gives every video its 2.
    lines = [json.loads(line) for line in DEMO.with_suffix(".jsonl").read_text().splitlines()]
    manifest = tmp_path / "demo.jsonl"
    manifest.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "steps"}) + "\n" for line in lines))
    report = cli.json("run", str(manifest), "--name", "from-jsonl", "--set", "steps=2",
                      "--output", f"file://{tmp_path / 'elsewhere'}/")
    assert report["name"] == "from-jsonl" and all(v["steps"] == 2 for v in report["videos"])
    check_videos(report, lambda uri: open(uri[len("file://"):], "rb").read())
    assert (tmp_path / "elsewhere" / "from-jsonl").is_dir()


def test_run_a_long_video_in_chunks_beside_a_short_one(cli, tmp_path):
    """9 s of `tiny` (73 frames: 3 chunks of its 33-frame window) and a 4 s video of the window's shape, through the
    CLI and a Celery worker: each finished chunk hands the worker a ticket for the next."""
    manifest = tmp_path / "long.yaml"
    manifest.write_text("name: long\ndefaults: {steps: 2}\nvideos:\n  - {id: long, prompt: a long one, duration_s: 9}"
                        "\n  - {id: short, prompt: a short one, duration_s: 4}\n")
    report = cli.json("run", str(manifest))
    check_videos(report, lambda uri: open(uri[len("file://"):], "rb").read())
    videos = {v["id"]: v for v in report["videos"]}
    assert (videos["long"]["frames"], videos["long"]["chunks"]) == (73, 3)
    assert (videos["short"]["frames"], videos["short"]["chunks"], videos["short"]["seam_score"]) == (33, 1, None)
    assert videos["long"]["seam_score"] > 0 and isinstance(videos["long"]["needs_review"], bool)
    assert decode_frames((tmp_path / "outputs" / "long" / "long.mp4").read_bytes()).shape[0] == 73
    assert not any((tmp_path / "outputs" / "_chunks").rglob("*.safetensors")), "checkpoints removed"
    text = cli("report", "long").stdout
    assert "long" in text and " 3 " in text, text


def test_bad_manifest_exits_2_and_writes_nothing(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nvideos:\n  - id: a\n    prompt: ok\n    seeed: 3\n  - id: a\n    prompt: dup\n")
    proc = cli("submit", str(bad), check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{bad}:5: videos[0].seeed" in proc.stderr and "did you mean 'seed'" in proc.stderr
    assert f"{bad}:6: videos[1].id" in proc.stderr
    db = tmp_path / "reelbatch.db"
    if db.exists():
        assert sqlite3.connect(db).execute("select count(*) from runs").fetchone() == (0,)


def test_submit_is_idempotent_and_refuses_a_name_clash(cli, tmp_path):
    first = cli.json("submit", str(DEMO))
    assert first["created"] is True and first["videos"] >= 3
    again = cli.json("submit", str(DEMO))
    assert again["run_id"] == first["run_id"] and again["created"] is False
    new = cli.json("submit", str(DEMO), "--new-run")
    assert new["created"] is True and new["name"] == "demo-2"
    clash = tmp_path / "clash.yaml"
    clash.write_text("name: demo\nvideos:\n  - id: other\n    prompt: a different video\n")
    proc = cli("submit", str(clash), check=False)
    assert proc.returncode == 2 and "'demo' is already used" in proc.stderr


def test_submitting_a_large_file_shows_its_progress(cli, tmp_path):
    """From 100 videos, `submit` shows its progress on stderr: the rows recorded, then the worker tickets queued."""
    big = tmp_path / "big.yaml"
    big.write_text("name: big\nvideos:\n" + "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(120)))
    proc = cli("submit", str(big), "--json")
    assert json.loads(proc.stdout)["pending"] == 120
    assert re.search(r"recording big .*120/120", proc.stderr), proc.stderr
    assert re.search(r"queueing big .*120/120", proc.stderr), proc.stderr
    small = cli("submit", str(DEMO), "--json")
    assert "recording" not in small.stderr, "a small file submits without a progress bar"


def test_run_to_s3_with_postgres_and_redis(cli, cli_env, s3_env, postgres_url, redis_server):
    """The production parts: PostgreSQL, a Redis broker and an S3-protocol server, all real, on loopback."""
    bucket = s3_env
    cli.env = {**cli_env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")},
               "REELBATCH_DATABASE_URL": postgres_url, "REELBATCH_BROKER_URL": redis_server,
               "REELBATCH_OUTPUT": f"s3://{bucket}/renders/"}
    cli("db", "upgrade")
    report = cli.json("run", str(DEMO))
    s3 = boto3.client("s3")

    def read(uri):
        assert uri.startswith(f"s3://{bucket}/renders/demo/")
        return s3.get_object(Bucket=bucket, Key=uri[len(f"s3://{bucket}/"):])["Body"].read()

    check_videos(report, read)
    head = s3.head_object(Bucket=bucket, Key=f"renders/demo/{report['videos'][0]['id']}.mp4")
    assert head["ContentType"] == "video/mp4"
    assert head["Metadata"]["run"] == "demo" and head["Metadata"]["model"] == "toy"
    assert head["Metadata"]["seed"] == str(report["videos"][0]["seed"])
