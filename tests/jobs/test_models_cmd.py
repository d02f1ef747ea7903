"""`reelbatch models`: every model a manifest may name, run as a user runs it (`python -m jobs models`) against a real
models file whose entries point at the built-in tiny model's folder. Every expected value is written out by hand."""

import json
import subprocess
import sys

import pytest

from engine.levers import content_key, gates
from engine.levers.gates import Gate
from engine.models.file import load_registry
from tests.conftest import REPO

KEYS = ["name", "source", "path", "family", "defaults", "precision", "text_encoder_precision", "adapters",
        "image_condition", "teacher", "gates"]


def _models(tmp_path, model_cache, models_file, *args):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "REELBATCH_MODELS": str(models_file), "REELBATCH_CACHE_DIR": str(model_cache)}
    return subprocess.run([sys.executable, "-m", "jobs", "models", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def models_file(tmp_path, model_cache):
    from engine.models.tiny import ensure_tiny

    folder = ensure_tiny(model_cache)
    path = tmp_path / "models.yaml"
    path.write_text(f"# the tiny folder, twice\nsmall:\n  path: {folder}\n"
                    "  defaults: {width: 128, height: 96, fps: 12, duration_s: 2, steps: 30, guidance: 4.5}\n"
                    "  precision: int8\n  image_condition: first_frame\n"
                    f"\nsmall-fast:\n  path: {folder}\n  teacher: small\n")
    return path


def test_each_entry_is_listed_with_its_line_defaults_and_gates(tmp_path, model_cache, models_file):
    proc = _models(tmp_path, model_cache, models_file, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = {m["name"]: m for m in json.loads(proc.stdout)}
    assert [list(m) for m in listed.values()] == [KEYS] * len(listed), "the same keys, in one order, for every model"
    folder = str(model_cache / "models" / "tiny-v1")
    assert listed["small"] == {
        "name": "small", "source": f"{models_file}:2", "path": folder, "family": "wan2.1",
        # 2 s at 12 fps is 24 frames, rounded to the tiny VAE's 4k+1: 25.
        "defaults": {"width": 128, "height": 96, "fps": 12, "duration_s": 2.0, "frames": 25, "steps": 30,
                     "guidance": 4.5},
        "precision": "int8", "text_encoder_precision": None, "adapters": [], "image_condition": "first_frame",
        "teacher": None, "gates": [{"setting": "precision=int8", "state": "not measured"}]}
    # Nothing but a path: Wan 2.1's published defaults (832x480, 5 s at 16 fps: 80 frames, so 81).
    assert listed["small-fast"] == {
        "name": "small-fast", "source": f"{models_file}:8", "path": folder, "family": "wan2.1",
        "defaults": {"width": 832, "height": 480, "fps": 16, "duration_s": 5.0, "frames": 81, "steps": 50,
                     "guidance": 5.0},
        "precision": "auto", "text_encoder_precision": None, "adapters": [], "image_condition": None,
        "teacher": "small", "gates": [{"setting": "distilled", "state": "not measured"}]}
    assert listed["tiny"] == {
        "name": "tiny", "source": "built-in", "path": folder, "family": "wan2.1",
        "defaults": {"width": 64, "height": 64, "fps": 8, "duration_s": 1.0, "frames": 9, "steps": 4, "guidance": 5.0},
        "precision": "auto", "text_encoder_precision": None, "adapters": [], "image_condition": "first_frame",
        "teacher": None, "gates": []}
    assert listed["toy-fast"]["source"] == "built-in"
    assert listed["toy-fast"]["adapters"] == [{"path": str(REPO / "engine/models/toy-fast/adapter.safetensors"),
                                               "scale": 1.0, "expert": "high_noise"}]
    assert {"tiny", "tiny-i2v", "toy", "toy-fast", "toy-i2v", "small", "small-fast"} <= set(listed)


def test_the_table_shows_the_same(tmp_path, model_cache, models_file):
    proc = _models(tmp_path, model_cache, models_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()}
    assert rows["model"][:3] == ["model", "from", "family"]
    assert rows["small"] == ["small", f"{models_file}:2", "wan2.1", "128x96", "12", "2", "25", "30", "4.5", "int8",
                             "-", "first_frame", "precision=int8:", "not", "measured",
                             str(model_cache / "models" / "tiny-v1")]


def _gate(identity: str, setting: str, count: int, failures: list[str]) -> Gate:
    return Gate(model="small-fast", identity=identity, setting=setting, count=count, batch=1, speedup=2.0,
                psnr_db_min=20.0, psnr_db_mean=22.0, ssim_min=0.6, adherence={}, exact_adherence={},
                measured_at="2026-12-06T00:00:00+00:00", failures=failures)


@pytest.mark.parametrize("count, failures, state", [
    (32, [], "passed"),
    (8, [], "passed on too few videos"),
    (32, ["motion 0.2x the teacher's, under 0.5x"], "failed"),
])
def test_the_gate_state_is_the_one_a_worker_refuses_by(tmp_path, model_cache, models_file, count, failures, state):
    """A recorded distilled gate, as `bench quality` would leave it: the listing shows its state, and
    engine.levers.gates.require lets the model render exactly when that state is `passed`."""
    info = load_registry(models_file).get("small-fast")
    identity = content_key.gate_key(info, info.path, content_key.FileDigests(model_cache))
    cache = tmp_path / "cache"  # its own records, apart from the session's model cache
    gates.record(cache, _gate(identity, gates.DISTILLED, count, failures))
    proc = _models(tmp_path, cache, models_file, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = {m["name"]: m for m in json.loads(proc.stdout)}
    assert listed["small-fast"]["gates"] == [{"setting": "distilled", "state": state}]
    assert listed["small"]["gates"] == [{"setting": "precision=int8", "state": "not measured"}]
    if state == "passed":
        assert gates.require(cache, "small-fast", identity, gates.DISTILLED)["count"] == 32
    else:
        with pytest.raises(gates.UngatedSetting):
            gates.require(cache, "small-fast", identity, gates.DISTILLED)


def test_a_broken_models_file_is_one_line_and_exit_2(tmp_path, model_cache):
    models = tmp_path / "models.yaml"
    models.write_text("wan:\n  path: /models/wan\n  precison: int8\n")
    for args in ((), ("--json",)):
        proc = _models(tmp_path, model_cache, models, *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr == (f"REELBATCH_MODELS: {models}:3: model 'wan': unknown key 'precison' "
                               "(did you mean 'precision'?)\n")
        assert proc.stdout == ""
