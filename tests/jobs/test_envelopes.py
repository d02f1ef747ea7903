"""Memory envelopes in use (issue 43): kept in a real database (SQLite and PostgreSQL), a worker's claim taking at
most the batch its envelope allows and passing over a shape of which not one video fits, an out-of-memory error
shrinking the kept envelope, submit and estimate refusing a video that fits no measured device (the real CLI, nothing
written), and `reelbatch bench envelope` measuring tiny on this CPU and keeping what it measured.

Hand-worked numbers. Envelope A: 10 GiB, 1 GiB resident, 20% spare: 7 GiB for a batch, a fixed 1 GiB, so 6144 MiB
for videos. The toy's 32x32, 9 frames is 5 latent frames x 4 x 4 = 80 tokens; at 25.6 MiB a token a video takes
2048 MiB, so 3 fit; at 64x64 (5 x 8 x 8 = 320 tokens) one takes 8192 MiB: none fits.
"""

import json
import sqlite3
import subprocess
import sys

from engine.models.envelope import Envelope
from engine.models.shape_rules import rules_of
from jobs.claims import claims
from jobs.claims.claims import Serving
from jobs.db import envelopes
from jobs.db.connect import session_factory
from jobs.manifest import load_manifest
from jobs.render import envelopes as worker_envelopes
from jobs.settings import Settings
from tests.conftest import REPO
from tests.jobs.test_routing import submit

MiB, GiB = 2**20, 2**30
A = Envelope("toy", "cuda: A, 10.0 GiB", memory_bytes=10 * GiB, resident_bytes=GiB, fixed_bytes=GiB,
             per_token_bytes=25.6 * MiB, per_pixel_bytes=0.0)


def test_an_envelope_is_kept_per_model_and_device_and_shrinks_on_out_of_memory(factory):
    envelopes.record(factory, A, [], "{}")
    other = Envelope("toy", "cuda: B, 80.0 GiB", 80 * GiB, GiB, GiB, MiB, 0.0)
    envelopes.record(factory, other, [], "{}")
    assert envelopes.load(factory, model="toy", device="cuda: A, 10.0 GiB") == [A]
    assert [e.device for e in envelopes.load(factory, model="toy")] == ["cuda: A, 10.0 GiB", "cuda: B, 80.0 GiB"]
    smaller = envelopes.shrink(factory, "toy", "cuda: A, 10.0 GiB", 3, 80, 32, 32, "toy|32x32|f9|s20|g2")
    assert smaller.largest_batch(80, 32, 32) == 2
    (kept,) = envelopes.load(factory, device="cuda: A, 10.0 GiB")
    assert (kept.ooms, kept.last_oom, kept.largest_batch(80, 32, 32)) == (1, "3 x toy|32x32|f9|s20|g2", 2)
    # Measured again: the new line, with no OOMs.
    envelopes.record(factory, A, [], "{}")
    assert envelopes.load(factory, device="cuda: A, 10.0 GiB") == [A]
    assert envelopes.shrink(factory, "tiny", "cuda: A, 10.0 GiB", 2, 48, 64, 64, "k") is None


def test_a_claim_takes_the_envelopes_batch_and_leaves_a_shape_that_does_not_fit(factory, registry, tmp_path):
    submit(factory, registry, tmp_path, "big", "toy", 2, rank=100, extra="defaults: {resolution: 64x64}\n")
    submit(factory, registry, tmp_path, "small", "toy", 5, rank=10)
    serving = Serving(("toy",), envelopes={"toy": (A, rules_of(registry.get("toy")))})
    claim = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60, serving=serving)
    assert [u.key for u in claim.units] == ["small0", "small1", "small2"]
    assert claim.batch.shape.width == 32
    # Without the envelope the better-ranked 64x64 work goes first, at the worker's batch.
    claim = claims.claim_batch(factory, owner="w", max_batch=8, lease_s=60, serving=Serving(("toy",)))
    assert [u.key for u in claim.units] == ["big0", "big1"]


def test_an_out_of_memory_error_shrinks_this_workers_envelope(tmp_path, monkeypatch):
    monkeypatch.setenv("REELBATCH_DATABASE_URL", f"sqlite:///{tmp_path / 'r.db'}")
    monkeypatch.setenv("REELBATCH_DEVICE", "cpu")
    settings = Settings.from_env()
    factory = session_factory(settings.database_url)
    device = worker_envelopes.this_device(settings)
    assert device.startswith("cpu: ") and device.endswith(" GiB")
    envelopes.record(factory, Envelope("toy", device, 10 * GiB, GiB, GiB, 25.6 * MiB, 0.0), [], "{}")
    assert worker_envelopes.for_worker(settings, factory)["toy"].largest_batch(80, 32, 32) == 3
    shape = load_manifest(_toy_manifest(tmp_path), registry=settings.registry()).videos[0]
    from engine.types import Shape

    worker_envelopes.after_oom(settings, factory, settings.registry().get("toy"),
                               Shape("toy", shape.width, shape.height, shape.frames, 20, 2.0), 3)
    assert worker_envelopes.for_worker(settings, factory)["toy"].largest_batch(80, 32, 32) == 2


def _toy_manifest(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text("name: t\nmodel: toy\nvideos:\n  - {id: a, prompt: a red circle}\n")
    return path


class Cli:
    def __init__(self, tmp_path):
        self.folder, self.db = tmp_path, tmp_path / "r.db"
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
                    "REELBATCH_DATABASE_URL": f"sqlite:///{self.db}", "OMP_NUM_THREADS": "1",
                    "REELBATCH_CACHE_DIR": str(tmp_path / "cache"), "REELBATCH_BROKER_URL":
                    f"sqla+sqlite:///{tmp_path / 'broker.db'}", "REELBATCH_OUTPUT": f"file://{tmp_path}/out/"}

    def __call__(self, *args, env=None):
        return subprocess.run([sys.executable, "-m", "jobs", *args], cwd=self.folder, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=600)

    def count(self, table):
        with sqlite3.connect(self.db) as db:
            return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


MANIFEST = """name: sizes
model: tiny
videos:
  - {id: small, prompt: a red circle, resolution: 64x64}
  - {id: huge, prompt: a red circle, resolution: 1024x1024}
"""


def test_submit_and_estimate_refuse_a_video_that_fits_no_measured_device(tmp_path):
    cli = Cli(tmp_path)
    # One measured device for tiny: 2 GiB, 0.5 GiB resident: 1.6 - 0.5 = 1.1 GiB for a batch; 0.1 GiB fixed and
    # 4 KiB a frame pixel. 64x64: 0.1 GiB + 16 MiB, fits. 1024x1024 (3 x 64 x 64 = 12,288 tokens): 0.1 GiB + 4 GiB.
    envelopes.record(session_factory(cli.env["REELBATCH_DATABASE_URL"]),
                     Envelope("tiny", "cuda: Small GPU, 2.0 GiB", 2 * GiB, GiB // 2, 0.1 * GiB, 0.0, 4096.0), [], "{}")
    (tmp_path / "m.yaml").write_text(MANIFEST)
    for command in ("submit", "estimate"):
        proc = cli(command, "m.yaml")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == (
            "m.yaml:5: videos[1].resolution: 1024x1024, 9 frames a pass (12,288 latent tokens) fits no device tiny's "
            "memory envelope is measured on: cuda: Small GPU, 2.0 GiB: at most 1.10 GiB for a batch (80% of 2.00 GiB "
            "less 0.50 GiB resident), one video needs 4.10 GiB; make it smaller or shorter, or add a device with more "
            "memory (`reelbatch bench envelope`)")
    assert cli.count("runs") == 0
    # Off, nothing is checked: the run is recorded.
    proc = cli("submit", "m.yaml", env={"REELBATCH_ENVELOPE": "off"})
    assert proc.returncode == 0, proc.stderr
    assert cli.count("videos") == 2


def test_bench_envelope_measures_tiny_on_this_cpu_and_keeps_it(tmp_path):
    cli = Cli(tmp_path)
    proc = cli("bench", "envelope", "--model", "tiny", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    # The plan around tiny's 64x64, 9 frames: batch 1 and 2, 128 wide, 17 frames; held out 96x64 at 13 frames,
    # 128x128, and 17 frames at batch 2.
    assert [(p["width"], p["height"], p["frames"], p["batch"]) for p in found["fitted"]] == [
        (64, 64, 9, 1), (64, 64, 9, 2), (128, 64, 9, 1), (64, 64, 17, 1)]
    assert [(p["width"], p["height"], p["frames"], p["batch"]) for p in found["held_out"]] == [
        (96, 64, 13, 1), (128, 128, 9, 1), (64, 64, 17, 2)]
    assert all(p["peak_bytes"] > 2**20 for p in found["fitted"] + found["held_out"])
    assert found["envelope"]["device"].startswith("cpu: ")
    with sqlite3.connect(cli.db) as db:
        rows = db.execute("SELECT model, device, ooms, points FROM envelopes").fetchall()
    assert [(m, d, o, len(json.loads(p))) for m, d, o, p in rows] == [("tiny", found["envelope"]["device"], 0, 4)]
