"""What a gate record rests on: the content key of the files it covers, its sample size, the reference-free
measures a distilled gate compares, and 8-bit attention gated like any other lever. Expected values by hand."""

import os
import shutil
from datetime import datetime, timezone

import numpy as np
import pytest

from engine.engine import Engine
from engine.levers import content_key, gate_rules, gates
from engine.levers.config import EngineConfig
from engine.levers.gate_measures import flicker, frozen_videos, is_frozen, motion
from engine.levers.gates import UngatedSetting
from engine.models.file import load_registry
from engine.models.registry import Registry
from engine.models.tiny import ensure_tiny


def frames(*values) -> np.ndarray:
    """An 8x8 video whose frame t is the flat level values[t] (with one dark corner pixel: never blank)."""
    v = np.stack([np.full((8, 8, 3), x, dtype=np.uint8) for x in values])
    v[:, 0, 0] = 0
    return v


def test_motion_and_frozen_videos_as_defined():
    rising = frames(0, 10, 20, 30, 40)  # every step moves 63 of the 64 pixels by 10: never still
    stuck = frames(0, 50, 50, 50, 50)  # one step, then three still ones: four frames unchanged, frozen
    paused = frames(0, 0, 0, 9, 9)  # two still steps, a move, one still: no four frames unchanged
    assert [is_frozen(v) for v in (rising, stuck, paused)] == [False, True, False]
    assert frozen_videos([rising, stuck, paused]) == 1
    # First frame against last, over every pixel (the corner stays 0): 40, 50 and 9, each x 63/64.
    assert motion([rising, stuck, paused]) == pytest.approx((40 + 50 + 9) / 3 * 63 / 64)
    # Flicker: mean step change; rising 10 x 63/64 each step; stuck 50/4 x 63/64; paused 9/4 x 63/64.
    assert flicker([rising, stuck, paused]) == pytest.approx((10 + 12.5 + 2.25) / 3 * 63 / 64)


def judge(**given):
    measured = dict(flicker_=4.0, teacher_flicker=4.0, blank=0, teacher_blank=0, motion_=20.0, teacher_motion=20.0)
    return gate_rules.judge_distilled({}, {}, **{**measured, **given})


def test_a_student_moving_less_freezing_more_or_reading_the_prompt_worse_fails():
    assert judge() == []
    assert judge(motion_=10.0) == []  # 0.5x: the limit
    assert judge(motion_=9.9) == ["motion 9.90 is under 0.5x the teacher's 20.00"]
    assert judge(frozen=1, teacher_frozen=1) == []
    assert judge(frozen=2, teacher_frozen=1) == ["2 frozen videos (the teacher: 1)"]
    assert judge(clip=29.0, teacher_clip=30.0) == []  # 1 point under: the margin
    assert judge(clip=28.9, teacher_clip=30.0) == ["CLIP score 28.90 is more than 1 below the teacher's 30.00"]


def test_a_student_that_freezes_fails_its_gate():
    teacher = [frames(40, 80, 120, 160, 200) for _ in range(gates.MIN_SAMPLE)]
    frozen = [np.repeat(v[:1], 5, axis=0) for v in teacher]  # the first frame, held
    gate = gates.distilled_gate("fast", "id", "slow", adherence={}, teacher_adherence={}, videos=frozen,
                                teacher_videos=teacher, batch=8, speedup=4.0)
    assert gate.motion == 0.0 and gate.teacher_motion == pytest.approx(157.5)  # (200 - 40) x 63/64; no frame is blank
    assert gate.frozen_videos == 32 and gate.teacher_frozen_videos == 0
    assert gate.failures == ["32 frozen videos (the teacher: 0)", "motion 0.00 is under 0.5x the teacher's 157.50"]


def test_each_video_must_reach_the_ssim_floor_unless_a_judge_reads_it_right():
    assert gate_rules.judge({}, {}, 30.0, [0.95, 0.51, 0.50]) == []
    assert gate_rules.judge({}, {}, 30.0, [0.95, 0.49, 0.3]) == [
        "2 of 3 videos have SSIM under 0.5 against their exact renders (worst 0.300)"]
    # Where a judge reads the prompts: the video it reads right (the 0.3) is another good video; the one it reads
    # wrong (the 0.49) still fails the floor, and alone names the worst.
    assert gate_rules.judge({}, {}, 30.0, [0.95, 0.49, 0.3], read_right=[True, False, True]) == [
        "1 of 3 videos have SSIM under 0.5 against their exact renders (worst 0.490)"]
    assert gate_rules.judge({}, {}, 30.0, [0.95, 0.49, 0.3], read_right=[False, True, True]) == []


def record(cache_dir, identity: str, setting: str, count: int) -> None:
    gates.record(cache_dir, gates.Gate(model="tiny", identity=identity, setting=setting, count=count, batch=8,
                                       speedup=1.5, psnr_db_min=30, psnr_db_mean=35, ssim_min=0.9, adherence={},
                                       exact_adherence={}, measured_at=datetime.now(timezone.utc).isoformat()))


@pytest.fixture
def cache_dir(tmp_path, model_cache):
    ensure_tiny(model_cache)
    (tmp_path / "models").symlink_to(model_cache / "models")
    return tmp_path


def test_a_record_under_the_minimum_sample_releases_nothing(cache_dir):
    engine = Engine(EngineConfig(cache_dir=cache_dir, step_scale=0.5), Registry())
    identity = engine.gate_identity(Registry().get("tiny"))
    record(cache_dir, identity, "step_scale=0.5", 31)
    with pytest.raises(UngatedSetting, match="step_scale=0.5's quality gate for model 'tiny' passed on 31 videos, "
                                             "under the 32 a gate needs to release a lever"):
        engine.check_gate("tiny")
    record(cache_dir, identity, "step_scale=0.5", 32)
    Engine(EngineConfig(cache_dir=cache_dir, step_scale=0.5), Registry()).check_gate("tiny")


def test_sage_attention_is_a_lever_behind_a_gate(cache_dir):
    config = EngineConfig(cache_dir=cache_dir, attention="sage")
    assert config.lossy() == "attention=sage" and config.lossless().attention == "native"
    assert EngineConfig(cache_dir=cache_dir, attention="flash").lossy() == ""  # same math, other rounding
    assert EngineConfig(cache_dir=cache_dir).with_lossy("attention=sage,step_scale=0.5").lossy() == \
        "step_scale=0.5,attention=sage"
    with pytest.raises(ValueError, match="attention=flash is not a gated kernel"):
        config.with_lossy("attention=flash")
    with pytest.raises(UngatedSetting, match="lossy setting attention=sage has no recorded quality gate for model "
                                             "'tiny'.*--setting attention=sage"):
        Engine(config, Registry()).check_gate("tiny")
    record(cache_dir, Engine(config, Registry()).gate_identity(Registry().get("tiny")), "attention=sage", 32)
    Engine(config, Registry()).check_gate("tiny")


def test_the_key_is_the_files_content_computed_once(tmp_path, model_cache):
    """Two copies of the tiny Wan folder, registered through a models file: the same content is the same key
    wherever it lies and whenever it was written; one changed byte of a weight file is another key."""
    for name in ("a", "b"):
        shutil.copytree(ensure_tiny(model_cache), tmp_path / name)
    os.utime(tmp_path / "b" / "vae" / "config.json", (0, 0))  # another modification time, the same content
    models = tmp_path / "models.yaml"
    models.write_text("".join(f"{n}:\n  path: {tmp_path / n}\n  max_sequence_length: 64\n" for n in ("a", "b")))
    registry = load_registry(models)
    digests = content_key.FileDigests(tmp_path / "cache")
    key_a = content_key.gate_key(registry.get("a"), tmp_path / "a", digests)
    files = len(content_key.folder_files(tmp_path / "a"))
    assert digests.computed == files and files >= 8  # index, scheduler, encoder, tokenizer, transformer, VAE
    assert content_key.gate_key(registry.get("b"), tmp_path / "b", digests) == key_a

    again = content_key.FileDigests(tmp_path / "cache")  # another process: the digests file remembers
    assert content_key.gate_key(registry.get("a"), tmp_path / "a", again) == key_a and again.computed == 0

    weights = tmp_path / "a" / "transformer" / "diffusion_pytorch_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    changed = content_key.gate_key(registry.get("a"), tmp_path / "a", again)
    assert changed != key_a and again.computed == 1  # only the changed file read again


def test_a_clip_folder_is_checked_when_the_models_file_is_read(tmp_path, model_cache):
    tiny = ensure_tiny(model_cache)
    (tmp_path / "clip").mkdir()
    (tmp_path / "clip" / "config.json").write_text('{"model_type": "siglip"}')
    models = tmp_path / "models.yaml"
    models.write_text(f"mine:\n  path: {tiny}\n  clip: {tmp_path / 'clip'}\n")
    with pytest.raises(Exception, match=f"{models}: model 'mine': clip: .*model_type is 'siglip', expected 'clip'"):
        load_registry(models)
    models.write_text(f"mine:\n  path: {tiny}\n  clip: {tmp_path / 'none'}\n")
    with pytest.raises(Exception, match="clip: .*none holds no config.json"):
        load_registry(models)


def test_a_lever_is_held_to_exact_modes_reference_free_measures():
    exact = gate_rules.Measured(flicker=4.0, motion=20.0, blank=0, frozen=1)
    fine = gate_rules.Measured(flicker=5.0, motion=10.0, blank=0, frozen=1)  # 1.25x and 0.5x: the limits
    assert gate_rules.judge({}, {}, 30.0, [0.9], fine, exact) == []
    worse = gate_rules.Measured(flicker=5.2, motion=9.0, blank=3, frozen=2)
    assert gate_rules.judge({}, {}, 30.0, [0.9], worse, exact) == [
        "3 blank frames (exact mode's: 0)", "2 frozen videos (exact mode's: 1)",
        "flicker 5.20 is over 1.25x exact mode's 4.00", "motion 9.00 is under 0.5x exact mode's 20.00"]
