"""The shipped `toy-fast` (engine/toy/weights-fast): 4 steps of one transformer pass, judged as `toy` is on the
80-pair quality set after MP4 against its teacher, and on long videos rendered in chunks."""

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.gates import UngatedSetting
from engine.models import Registry
from engine.toy import distill_report
from engine.toy.world import COMBINATIONS
from engine.types import RenderBatch, RenderRequest
from jobs.cli.toy import LONG_SEEDS
from jobs.quality.evaluate import round_trip
from jobs.quality.sample import sample_set


def test_toy_fast_is_four_transformer_calls_of_the_batch_and_no_unconditional_pass(tmp_path):
    registry = Registry()
    info = registry.get("toy-fast")
    assert (info.defaults.steps, info.defaults.guidance, info.teacher) == (4, 1.0, "toy")
    engine = Engine(EngineConfig(cache_dir=tmp_path), registry)
    engine.gate_checked.add("toy-fast")  # what it computes is tested here; its gate in the test below
    calls = []
    hook = engine.pipeline("toy-fast").transformer.register_forward_hook(
        lambda module, args, kwargs, out: calls.append(len(kwargs["hidden_states"])), with_kwargs=True)
    shape = distill_report.native(registry, "toy-fast")
    rendered = engine.render(RenderBatch(shape, tuple(RenderRequest(i, c.prompt, None, c.seed)
                                                      for i, c in enumerate(sample_set(8)))))
    hook.remove()
    assert calls == [8, 8, 8, 8]
    assert all(v.error is None and v.frames.shape == (9, 32, 32, 3) for v in rendered)
    assert engine.light_decoder("toy-fast") is not None


def test_toy_fast_against_its_teacher_short_and_long(tmp_path):
    """Measured 2026-12-01 (the card): colour 95%, shape 82.5%, direction 97.5%, background 100% against the
    teacher's 100, 82.5, 96.2, 100; long-video windows colour 95%, direction 96.2%. Direction, background and shape
    keep the teacher's; colour and flicker do not yet: the light decoder turns some red objects blue and shimmers
    (1.30x the teacher's frame-to-frame change), so the gate fails on exactly those two and the engine refuses
    toy-fast (docs/TOY_TRAINING.md). Floors sit one verdict (1.25 points) under what was measured: the teacher's own
    shape moved by 2 verdicts between two processes."""
    registry = Registry()
    engine = Engine(EngineConfig(cache_dir=tmp_path), registry)
    cases = [(c.prompt, c.seed) for c in sample_set()]
    long_cases = [(f"a {c} {s} moving {d} on a {b} background", LONG_SEEDS + i)
                  for i, (c, s, d, b) in enumerate(COMBINATIONS[5 * i] for i in range(16))]
    results = distill_report.evaluate(engine, "toy-fast", cases, long_cases, lambda frames: round_trip(frames, 8))
    assert results.student["direction"] >= 0.9625 and results.student["background"] >= 0.9875
    assert results.student["shape"] >= 0.8125 and results.student["colour"] >= 0.9375, results.student
    assert results.long["windows"] == 80 and results.long["direction"] >= 0.95, results.long
    assert results.gate.flicker > 1.25 * results.gate.teacher_flicker
    assert {f.split()[0] for f in results.gate.failures} <= {"colour", "flicker"}, results.gate.failures
    with pytest.raises(UngatedSetting, match="failed its distilled quality gate"):
        Engine(EngineConfig(cache_dir=tmp_path), registry).pipeline("toy-fast")
