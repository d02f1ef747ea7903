"""A precision below native, from the CLI: refused at worker start and at submit without its gate (naming where it
was set, the registration and the mode), and with its gate rendered end to end, its cost records saying int8."""

import sqlite3
from datetime import datetime, timezone

import pytest

from engine.engine import Engine
from engine.levers import gates
from engine.levers.config import EngineConfig
from engine.models.registry import Registry
from engine.models.tiny import ensure_tiny

MANIFEST = "name: eight\nmodel: {model}\nvideos:\n  - {{id: a, prompt: a red ball}}\n  - {{id: b, prompt: a blue cube}}\n"


@pytest.fixture
def cache(tmp_path, model_cache):
    """A cache folder of this test's own (its gates file) holding the session's tiny model."""
    ensure_tiny(model_cache)
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / "models").symlink_to(model_cache / "models")
    return folder


@pytest.fixture
def env(cli, cache):
    cli.env.update(REELBATCH_CACHE_DIR=str(cache), REELBATCH_WORKER_MODELS="tiny")
    return cli


def test_fp8_and_an_ungated_mode_are_refused_at_worker_start(env):
    env.env["REELBATCH_PRECISION"] = "fp8"
    proc = env("worker", check=False, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert ("REELBATCH_PRECISION: model 'tiny': precision fp8 cannot run here: fp8 needs a CUDA GPU with FP8 units"
            in " ".join(proc.stderr.split()))
    env.env["REELBATCH_PRECISION"] = "int8"
    proc = env("worker", check=False, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert ("REELBATCH_PRECISION: lossy setting precision=int8 has no recorded quality gate for model 'tiny'"
            in " ".join(proc.stderr.split()))


def test_a_registration_without_its_gate_is_refused_at_submit_and_an_unknown_mode_when_read(env, tmp_path, cache):
    models = tmp_path / "models.yaml"
    models.write_text(f"tiny8:\n  path: {ensure_tiny(cache)}\n  max_sequence_length: 64\n  precision: int8-weight\n")
    env.env["REELBATCH_MODELS"] = str(models)
    (tmp_path / "m.yaml").write_text(MANIFEST.format(model="tiny8"))
    proc = env("submit", "m.yaml", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"{models}: model 'tiny8': precision: lossy setting precision=int8-weight has no recorded quality gate " \
           "for model 'tiny8'" in said and "reelbatch bench quality --model tiny8 --precision int8-weight" in said
    assert not (tmp_path / "reelbatch.db").exists(), "refused before anything was written"
    models.write_text(f"tiny8:\n  path: {ensure_tiny(cache)}\n  precision: int3\n")
    proc = env("submit", "m.yaml", check=False)
    assert proc.returncode == 2 and "model 'tiny8': precision must be one of auto, fp32, bf16, fp16, int8-weight, " \
                                   "int8, fp8, got 'int3'" in " ".join(proc.stderr.split())


def test_a_text_encoder_precision_without_its_gate_is_refused_at_submit_naming_its_key(env, tmp_path, cache):
    models = tmp_path / "models.yaml"
    models.write_text(f"tinyte:\n  path: {ensure_tiny(cache)}\n  text_encoder_precision: int8\n")
    env.env["REELBATCH_MODELS"] = str(models)
    (tmp_path / "m.yaml").write_text(MANIFEST.format(model="tinyte"))
    proc = env("submit", "m.yaml", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"{models}: model 'tinyte': text_encoder_precision: lossy setting text_encoder_precision=int8 has no " \
           "recorded quality gate for model 'tinyte'" in said, said
    assert "reelbatch bench quality --model tinyte --setting text_encoder_precision=int8" in said
    assert not (tmp_path / "reelbatch.db").exists(), "refused before anything was written"
    # A worker asks its device first: on this CPU fp8 cannot run at all, gate or none.
    models.write_text(f"tinyte:\n  path: {ensure_tiny(cache)}\n  text_encoder_precision: fp8\n")
    env.env["REELBATCH_WORKER_MODELS"] = "tinyte"
    proc = env("worker", check=False, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{models}: model 'tinyte': text_encoder_precision: model 'tinyte': text_encoder_precision fp8 cannot " \
           "run here: fp8 needs a CUDA GPU with FP8 units" in " ".join(proc.stderr.split())


def test_a_gated_int8_run_renders_and_its_cost_records_say_int8(env, tmp_path, cache):
    gates.record(cache, gates.Gate(
        model="tiny", identity=Engine(EngineConfig(cache_dir=cache), Registry()).gate_identity(Registry().get("tiny")),
        setting="precision=int8", count=32,
        batch=8, speedup=1.0, psnr_db_min=30, psnr_db_mean=35, ssim_min=0.9, adherence={}, exact_adherence={},
        measured_at=datetime.now(timezone.utc).isoformat()))
    env.env["REELBATCH_PRECISION"] = "int8"
    (tmp_path / "m.yaml").write_text(MANIFEST.format(model="tiny"))
    env("run", "m.yaml")
    report = env.json("report", "eight")
    assert [v["status"] for v in report["videos"]] == ["succeeded", "succeeded"]
    with sqlite3.connect(tmp_path / "reelbatch.db") as db:
        rows = db.execute("SELECT kind, precision FROM cost_records ORDER BY id").fetchall()
    assert sorted(rows) == [("gpu", "int8"), ("gpu", "int8"), ("storage", None), ("storage", None)]
