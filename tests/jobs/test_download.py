"""`reelbatch download`: a run rendered through the real path (tiny engine -> PyAV -> store -> rows), then fetched by
the command line into a folder, from a local store and from the S3-protocol server; each MP4 checked against the
database's SHA-256 and decoded with PyAV."""

import hashlib
import json
import socket

import av
import pytest
from typer.testing import CliRunner

from engine.engine import Engine
from jobs.cli import app
from jobs.db import queries, submission
from jobs.db.connect import session_factory
from jobs.manifest import load_manifest
from jobs.render.batch import render_next_batch
from jobs.settings import Settings
from jobs.usecases import runs

FILES = ["errors.jsonl", "results.jsonl", "v0.jpg", "v0.mp4", "v1.jpg", "v1.mp4"]


@pytest.fixture
def engine(model_cache, registry):
    return Engine(Settings.from_env({}).with_values({"engine.cache_dir": model_cache}).engine_config(), registry)


def rendered(tmp_path, registry, engine, monkeypatch, output=None, videos=2, batch=8):
    """Run `d` of `videos` tiny videos submitted and one batch (of at most `batch`) rendered."""
    manifest = tmp_path / "d.yaml"
    manifest.write_text("name: d\ndefaults: {steps: 2}\nvideos:\n"
                        + "".join(f"  - {{id: v{i}, prompt: video {i}}}\n" for i in range(videos)))
    url = f"sqlite:///{tmp_path / 'd.db'}"
    settings = Settings.from_env({}).with_values({"database_url": url, "worker.max_batch": batch})
    factory = session_factory(url)
    submission.submit_run(factory, load_manifest(manifest, registry=registry),
                          output=output or f"file://{tmp_path / 'out'}/")
    render_next_batch(settings, engine, factory)
    monkeypatch.setenv("REELBATCH_DATABASE_URL", url)
    return factory


def recorded(factory) -> dict[str, str]:
    _, videos = queries.load_report(factory, "d")
    return {v.key: v.sha256 for v, _ in videos}


def download(*args):
    return CliRunner().invoke(app, ["download", *map(str, args)])


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def check_mp4s(folder, sha256):
    for key in ("v0", "v1"):
        data = (folder / f"{key}.mp4").read_bytes()
        assert len(sha256[key]) == 64
        assert hashlib.sha256(data).hexdigest() == sha256[key]
        with av.open(str(folder / f"{key}.mp4")) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert (len(frames), frames[0].shape) == (9, (64, 64, 3))


def test_a_finished_run_is_fetched_whole_and_checked(tmp_path, registry, engine, monkeypatch):
    factory = rendered(tmp_path, registry, engine, monkeypatch)
    got = download("d", tmp_path / "dl", "--json")
    assert got.exit_code == 0, got.output
    data = json.loads(got.stdout)
    assert (sorted(data["written"]), data["skipped"], data["missing"], data["finished"]) == (FILES, [], {}, True)
    folder = tmp_path / "dl"
    assert listing(folder) == FILES  # no temporary file left beside them
    check_mp4s(folder, recorded(factory))
    for name in ("v0.jpg", "results.jsonl", "errors.jsonl"):
        assert (folder / name).read_bytes() == (tmp_path / "out" / "d" / name).read_bytes()
    assert [json.loads(line)["id"] for line in (folder / "results.jsonl").read_text().splitlines()] == ["v0", "v1"]
    assert (folder / "errors.jsonl").read_bytes() == b""


def test_a_second_download_writes_nothing_and_says_so(tmp_path, registry, engine, monkeypatch):
    rendered(tmp_path, registry, engine, monkeypatch)
    assert download("d", tmp_path / "dl").exit_code == 0
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "dl").iterdir()}
    again = download("d", tmp_path / "dl")
    assert again.exit_code == 0, again.output
    assert f"run d: 0 files written, 6 already in {tmp_path / 'dl'} (nothing to write)" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "dl").iterdir()} == before


def test_a_tampered_mp4_is_refused_and_leaves_no_file_under_its_name(tmp_path, registry, engine, monkeypatch):
    factory = rendered(tmp_path, registry, engine, monkeypatch)
    stored = tmp_path / "out" / "d" / "v1.mp4"
    stored.write_bytes(stored.read_bytes()[:-1] + b"\x00")
    bad = hashlib.sha256(stored.read_bytes()).hexdigest()
    got = download("d", tmp_path / "dl")
    assert got.exit_code == 1
    assert got.output == (f"run d: file://{stored} has sha256 {bad}, but the database recorded "
                          f"{recorded(factory)['v1']}; not written\n")
    assert listing(tmp_path / "dl") == ["v0.jpg", "v0.mp4"]  # fetched before it; nothing named v1, no temp file


def test_an_unfinished_run_gives_what_is_done_and_counts_the_rest(tmp_path, registry, engine, monkeypatch):
    rendered(tmp_path, registry, engine, monkeypatch, videos=3, batch=2)
    got = download("d", tmp_path / "dl")
    assert got.exit_code == 1, got.output
    assert "run d: 4 files written, 0 already in" in got.stdout
    assert "1 videos have no MP4: 1 pending" in got.stdout
    assert "run d is not finished: download again when it ends" in got.output
    assert listing(tmp_path / "dl") == ["v0.jpg", "v0.mp4", "v1.jpg", "v1.mp4"]  # no result files before the end
    runs.cancel(Settings.from_env(), "d")  # finished now: its result files are written (jobs.notify.finished)
    done = download("d", tmp_path / "dl", "--json")
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert (sorted(data["written"]), data["missing"]) == (["errors.jsonl", "results.jsonl"], {"cancelled": 1})
    assert json.loads((tmp_path / "dl" / "errors.jsonl").read_text())["id"] == "v2"


def test_an_unknown_run_is_one_line_exit_2(tmp_path, registry, engine, monkeypatch):
    rendered(tmp_path, registry, engine, monkeypatch)
    got = download("nope", tmp_path / "dl")
    assert (got.exit_code, got.output) == (2, "no run named or numbered 'nope' (see `reelbatch status`)\n")
    assert not (tmp_path / "dl").exists()


def test_from_s3_checked_and_an_unreachable_endpoint_names_the_setting(tmp_path, registry, engine, monkeypatch,
                                                                        s3_env):
    factory = rendered(tmp_path, registry, engine, monkeypatch, output=f"s3://{s3_env}/renders/")
    got = download("d", tmp_path / "dl")
    assert got.exit_code == 0, got.output
    assert listing(tmp_path / "dl") == FILES
    check_mp4s(tmp_path / "dl", recorded(factory))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    down = download("d", tmp_path / "dl2")
    assert down.exit_code == 2
    assert down.output.count("\n") == 1
    assert down.output.startswith(f"the store of run d cannot be read (its output s3://{s3_env}/renders/")
    assert f"127.0.0.1:{port}" in down.output and "check AWS_ENDPOINT_URL" in down.output
