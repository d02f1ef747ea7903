"""Lossy accelerators on the tiny model: what each computes, and that none renders without a passing gate."""

import dataclasses
from datetime import datetime, timezone

import numpy as np
import pytest

from engine.engine import Engine
from engine.frames.metrics import psnr
from engine.levers import gates
from engine.levers.config import EngineConfig
from engine.levers.gates import UngatedSetting
from engine.models.registry import Registry
from engine.models.tiny import ensure_tiny
from engine.types import RenderBatch, RenderRequest, Shape

SHAPE = Shape("tiny", 64, 48, 9, 4, 5.0)
REQUESTS = tuple(RenderRequest(i, f"prompt {i}", None, 300 + i) for i in range(2))


def passing_gate(cache_dir, setting: str, failures=()) -> gates.Gate:
    identity = Engine(EngineConfig(cache_dir=cache_dir), Registry()).gate_identity(Registry().get("tiny"))
    gate = gates.Gate(model="tiny", identity=identity, setting=setting, count=32, batch=8, speedup=1.5,
                      psnr_db_min=30, psnr_db_mean=35, ssim_min=0.9, adherence={}, exact_adherence={},
                      measured_at=datetime.now(timezone.utc).isoformat(), failures=list(failures))
    gates.record(cache_dir, gate)
    return gate


def gated_engine(cache_dir, **lossy) -> Engine:
    config = EngineConfig(cache_dir=cache_dir, **lossy)
    passing_gate(cache_dir, config.lossy())
    return Engine(config, Registry())


@pytest.fixture
def cache_dir(tmp_path, model_cache):
    """A cache folder of this test's own (its gates file) holding the session's tiny model."""
    ensure_tiny(model_cache)
    (tmp_path / "models").symlink_to(model_cache / "models")
    return tmp_path


def render(engine: Engine, shape: Shape = SHAPE) -> list[np.ndarray]:
    out = engine.render(RenderBatch(shape, REQUESTS))
    assert all(v.error is None for v in out), [v.error for v in out]
    return [v.frames for v in out]


@pytest.mark.parametrize("text, key", [
    ("step_cache=0.2", "step_cache=0.2"),
    ("step_scale=0.5, guidance_fraction=0.75", "guidance_fraction=0.75,step_scale=0.5"),
    ("step_cache=0", ""),
])
def test_settings_parse_to_one_canonical_key(text, key):
    assert EngineConfig(cache_dir=".").with_lossy(text).lossy() == key


@pytest.mark.parametrize("text, message", [
    ("step_cache", "expected NAME=VALUE"),
    ("warp=2", "expected NAME=VALUE with NAME one of"),
    ("step_scale=fast", "'fast' is not a number"),
    ("step_scale=0", r"step_scale must be in \(0, 1\]"),
    ("step_cache=1.5", r"step_cache must be in \[0, 1\]"),
])
def test_malformed_settings_name_the_part(text, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(cache_dir=".").with_lossy(text)


def test_steps_and_guided_steps():
    config = EngineConfig(cache_dir=".")
    assert (config.steps_for(20), config.guided_steps(20)) == (20, None)
    lossy = config.with_lossy("step_scale=0.5,guidance_fraction=0.25")
    assert (lossy.steps_for(20), lossy.guided_steps(10)) == (10, 2)
    assert lossy.steps_for(1) == 1 and lossy.guided_steps(1) == 1
    assert lossy.lossless().lossy() == "" and lossy.exact().lossy() == ""


def test_no_lossy_setting_renders_without_a_gate(cache_dir):
    engine = Engine(EngineConfig(cache_dir=cache_dir, step_scale=0.5), Registry())
    with pytest.raises(UngatedSetting, match=r"step_scale=0.5 has no recorded quality gate for model 'tiny'.*"
                                             r"reelbatch bench quality --model tiny --setting step_scale=0.5"):
        engine.render(RenderBatch(SHAPE, REQUESTS))
    passing_gate(cache_dir, "step_scale=0.5", failures=["mean PSNR against the exact renders is 20.0 dB"])
    with pytest.raises(UngatedSetting, match="failed its quality gate .*20.0 dB"):
        Engine(EngineConfig(cache_dir=cache_dir, step_scale=0.5), Registry()).render(RenderBatch(SHAPE, REQUESTS))
    passing_gate(cache_dir, "step_scale=0.5")
    assert len(render(Engine(EngineConfig(cache_dir=cache_dir, step_scale=0.5), Registry()))) == 2
    # A gate is for one setting: another strength is measured on its own.
    with pytest.raises(UngatedSetting, match="step_scale=0.25 has no recorded"):
        Engine(EngineConfig(cache_dir=cache_dir, step_scale=0.25), Registry()).render(RenderBatch(SHAPE, REQUESTS))


def test_a_gate_is_for_the_model_as_measured(cache_dir):
    """Changed weights (another size or time) are another model: its old gate no longer admits the setting."""
    passing_gate(cache_dir, "step_scale=0.5")
    Engine(EngineConfig(cache_dir=cache_dir, step_scale=0.5), Registry()).check_gate("tiny")
    recorded = gates.load(cache_dir)
    (key,) = recorded
    gates.record(cache_dir, gates.Gate(**{**{k: v for k, v in recorded[key].items() if k not in ("passed", "releases")},
                                          "identity": "another model"}))
    (cache_dir / "quality-gates.json").write_text(
        (cache_dir / "quality-gates.json").read_text().replace(key.split("|")[0], "0" * 64))
    with pytest.raises(UngatedSetting, match="no recorded quality gate"):
        Engine(EngineConfig(cache_dir=cache_dir, step_scale=0.5), Registry()).check_gate("tiny")


def test_fewer_steps_render_what_the_shorter_schedule_renders(cache_dir):
    half = render(gated_engine(cache_dir, step_scale=0.5))
    short = render(Engine(EngineConfig(cache_dir=cache_dir), Registry()), dataclasses.replace(SHAPE, steps=2))
    assert all(np.array_equal(a, b) for a, b in zip(half, short))


def test_guidance_fraction_one_is_exact_and_less_changes_the_late_steps(cache_dir):
    exact = render(Engine(EngineConfig(cache_dir=cache_dir), Registry()))
    unguided_tail = render(gated_engine(cache_dir, guidance_fraction=0.5))
    assert all(psnr(a, b) < 60 for a, b in zip(unguided_tail, exact)), "the late steps must change"
    # A fraction that rounds to every step (0.9 of 4) guides every step: exact mode, bit for bit.
    rounded = render(gated_engine(cache_dir, guidance_fraction=0.9))
    assert all(np.array_equal(a, b) for a, b in zip(rounded, exact))


def test_step_cache_reuses_blocks_only_past_its_threshold(cache_dir):
    exact = render(Engine(EngineConfig(cache_dir=cache_dir), Registry()))
    never = render(gated_engine(cache_dir, step_cache=1e-9))
    assert all(psnr(a, b) >= 60 for a, b in zip(never, exact)), "a threshold nothing passes must change nothing"
    always = render(gated_engine(cache_dir, step_cache=1.0))
    assert all(psnr(a, b) < 60 for a, b in zip(always, exact)), "a threshold every step passes reuses blocks"
