"""A distilled registration's gate (engine.levers.gate_rules.judge_distilled): adherence against the teacher's, blank
frames and flicker; and the engine refusing a registration that names a teacher until a passing gate is recorded for
it."""

import numpy as np
import pytest

from engine.engine import Engine
from engine.levers import gate_measures, gate_rules, gates
from engine.levers.config import EngineConfig
from engine.levers.gates import UngatedSetting
from engine.models.file import load_registry
from engine.models.tiny import ensure_tiny
from engine.types import RenderBatch, RenderRequest, Shape

TEACHER = {"colour": 1.0, "shape": 0.825, "direction": 0.9625, "background": 1.0}


def judge(adherence, flicker=4.0, teacher_flicker=4.0, blank=0, teacher_blank=0):
    return gate_rules.judge_distilled(adherence, TEACHER, flicker_=flicker, teacher_flicker=teacher_flicker, blank=blank,
                                 teacher_blank=teacher_blank)


def test_two_points_below_the_teacher_passes_and_one_verdict_more_fails():
    # 80 videos: one verdict is 1.25 points. Shape 80.5% would be the floor; 81.25% (65 of 80) passes, 80% fails.
    assert judge({"colour": 0.9875, "shape": 0.8125, "direction": 0.95, "background": 0.9875}) == []
    assert judge({"colour": 1.0, "shape": 0.80, "direction": 0.9625, "background": 1.0}) == [
        "shape adherence 80.0% is more than 2% below the teacher's 82.5%"]
    assert judge({"colour": 1.0, "shape": 0.9, "direction": 0.9375, "background": 1.0}) == [
        "direction adherence 93.8% is more than 2% below the teacher's 96.2%"]
    # All four at once is not an attribute: reported, not gated.
    assert gate_rules.judge_distilled({**TEACHER, "all_four": 0.70}, {**TEACHER, "all_four": 0.79}, flicker_=1.0,
                                 teacher_flicker=1.0, blank=0, teacher_blank=0) == []


def test_blank_frames_and_flicker_beyond_the_teachers_fail():
    fine = dict(TEACHER)
    assert judge(fine, blank=1, teacher_blank=1) == []
    assert judge(fine, blank=2, teacher_blank=1) == ["2 blank frames (the teacher: 1)"]
    assert judge(fine, flicker=5.0, teacher_flicker=4.0) == []  # 1.25x: the limit
    assert judge(fine, flicker=5.1, teacher_flicker=4.0) == ["flicker 5.10 is over 1.25x the teacher's 4.00"]


def test_flicker_and_blank_frames_are_measured_as_defined():
    video = np.zeros((3, 2, 2, 3), dtype=np.uint8)
    video[1:] = 10  # frame 0 -> 1 changes every value by 10, frame 1 -> 2 by 0: mean 5
    other = np.zeros((2, 2, 2, 3), dtype=np.uint8)
    other[1, 0] = 30  # half the pixels change by 30: 15
    assert gate_measures.flicker([video, other]) == pytest.approx((5.0 + 15.0) / 2)
    # Flat frames are blank: all three of `video`, frame 0 of `other`; frame 1 of `other` (half 0, half 30) is not.
    assert gate_measures.blank_frames([video, other]) == 4


def test_a_distilled_gate_reports_psnr_and_decides_on_adherence_and_flicker():
    teacher = [np.full((3, 8, 8, 3), 100, dtype=np.uint8) + np.arange(3, dtype=np.uint8)[:, None, None, None]]
    student = [teacher[0] + 1]  # every pixel 1 level off: flicker the same
    teacher[0][:, 0, 0] = 0  # not flat: no blank frames in either
    student[0][:, 0, 0] = 0
    gate = gates.distilled_gate("fast", "id", "slow", adherence=TEACHER, teacher_adherence=TEACHER, videos=student,
                                teacher_videos=teacher, batch=8, speedup=10.0)
    assert gate.passed and gate.setting == gates.DISTILLED and gate.teacher == "slow"
    assert gate.psnr_db_mean == pytest.approx(10 * np.log10(255**2 / (63 / 64)), abs=1e-6)
    assert gate.flicker == gate.teacher_flicker and gate.blank_frames == gate.teacher_blank_frames == 0


@pytest.fixture
def distilled(tmp_path, model_cache):
    """`tiny-fast`: the tiny folder with a 2-step Euler sampler and guidance 1, registered with teacher `tiny`."""
    tiny = ensure_tiny(model_cache)
    models = tmp_path / "models.yaml"
    models.write_text(f"tiny-fast:\n  path: {tiny}\n  max_sequence_length: 64\n  teacher: tiny\n"
                      "  sampler: {name: flow_euler, shift: 3.0}\n  defaults: {steps: 2, guidance: 1.0}\n")
    registry = load_registry(models)
    return registry, Engine(EngineConfig(cache_dir=tmp_path), registry).gate_identity(registry.get("tiny-fast"))


def test_the_engine_refuses_a_distilled_registration_until_its_gate_passed(tmp_path, distilled):
    registry, identity = distilled
    batch = RenderBatch(Shape("tiny-fast", 32, 32, 5, 2, 1.0), (RenderRequest(1, "x", None, 1),))
    with pytest.raises(UngatedSetting, match="model 'tiny-fast' is distilled and has no recorded quality gate against "
                                             "its teacher .*reelbatch bench quality --model tiny-fast"):
        Engine(EngineConfig(cache_dir=tmp_path), registry).render(batch)
    worse = {**TEACHER, "direction": 0.5}
    video = [np.arange(192, dtype=np.uint8).reshape(1, 8, 8, 3).repeat(2, axis=0)] * gates.MIN_SAMPLE
    failing = gates.distilled_gate("tiny-fast", identity, "tiny", adherence=worse, teacher_adherence=TEACHER,
                                   videos=video, teacher_videos=video, batch=8, speedup=4.0)
    gates.record(tmp_path, failing)
    with pytest.raises(UngatedSetting, match="failed its distilled quality gate against its teacher \\(direction adherence 50.0%"):
        Engine(EngineConfig(cache_dir=tmp_path), registry).render(batch)
    gates.record(tmp_path, gates.distilled_gate("tiny-fast", identity, "tiny", adherence=TEACHER,
                                                teacher_adherence=TEACHER, videos=video, teacher_videos=video,
                                                batch=8, speedup=4.0))
    (rendered,) = Engine(EngineConfig(cache_dir=tmp_path), registry).render(batch)
    assert rendered.error is None
    # The teacher itself needs no such gate, and a lossy setting on the student needs its own on top.
    assert Engine(EngineConfig(cache_dir=tmp_path), registry).render(
        RenderBatch(Shape("tiny", 32, 32, 5, 2, 1.0), batch.requests))[0].error is None
    with pytest.raises(UngatedSetting, match="lossy setting step_cache=0.1 has no recorded quality gate"):
        Engine(EngineConfig(cache_dir=tmp_path, step_cache=0.1), registry).render(batch)
