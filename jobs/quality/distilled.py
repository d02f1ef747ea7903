"""A distilled registration judged against its teacher: `reelbatch bench quality --model NAME` (its gate) and the
evaluation `reelbatch toy distill` ends with (its gate, long videos and card figures).

toyworld.distill_report renders and judges; this module chooses what it judges (the quality set, long videos'
prompts and seeds) and how a viewer sees it (the MP4 round trip), so the engine needs neither the job system nor
the encoder.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from engine.engine import Engine
from engine.frames.clip_score import ClipScorer
from engine.levers import gate_rules, gates
from engine.models.registry import Registry
from jobs.errors import UsageError
from jobs.quality.evaluate import REFERENCES, native_shape, round_trip, save_references
from jobs.quality.gate_sample import TOY_HELD_OUT, GateSample, gate_sample, judged_adherence, render_sample
from jobs.quality.sample import GATE_SAMPLE_SIZE, held_out_set, new_entropy, sample_set
from jobs.settings import Settings
from toyworld.distill_report import ATTRIBUTES, FastResults, evaluate, judge_against_teacher, render, with_folder
from toyworld.world import COMBINATIONS

# Long videos judged after `toy distill`: sixteen 4 s videos, prompts 5i of the 80 (every colour, and every shape,
# direction and background pairing once), seeds outside the quality set's 7000-7079 and the held-out range.
LONG_SEEDS = 9100
LONG_VIDEOS = 16


@dataclass
class DistilledJudgement:
    gate: gates.Gate
    student_s: float  # rendering the set, after a warm-up batch
    teacher_s: float
    flicker_ratio: float = gate_rules.FLICKER_RATIO

    def to_dict(self) -> dict:
        return {"gate": self.gate.to_dict(), "student_s": self.student_s, "teacher_s": self.teacher_s,
                "flicker_ratio_allowed": self.flicker_ratio,
                "psnr_against_teacher": {"mean_db": self.gate.psnr_db_mean, "min_db": self.gate.psnr_db_min,
                                         "required": False}}


def long_cases(count: int = LONG_VIDEOS) -> list[tuple[str, int]]:
    return [(f"a {c} {s} moving {d} on a {b} background", LONG_SEEDS + i)
            for i, (c, s, d, b) in enumerate(COMBINATIONS[5 * i] for i in range(count))]


def judge_registration(settings: Settings, model: str, *, count: int, batch: int, prompts: Path | None = None,
                       on_model: Callable[[str], None] | None = None, entropy: int | None = None
                       ) -> DistilledJudgement:
    """`reelbatch bench quality --model NAME [--prompts FILE]` for a distilled registration: it and its teacher
    render the gate's sample (jobs.quality.gate_sample) on the same prompts, seeds, sizes and frames, each at its
    own steps and guidance, with the lossy accelerators off and after a warm-up batch; adherence is judged after MP4
    on the toy world, a CLIP score is taken where the registration names a CLIP folder, and its gate is recorded."""
    return judge_draws(settings, model, draws=1, count=count, batch=batch, prompts=prompts, on_model=on_model,
                       entropy=entropy)[0]


def judge_draws(settings: Settings, model: str, *, draws: int, count: int, batch: int, prompts: Path | None = None,
                on_model: Callable[[str], None] | None = None, entropy: int | None = None
                ) -> list[DistilledJudgement]:
    """The distilled gate measured on `draws` samples, each a fresh held-out draw on the toy world (what another
    user's `bench quality` would draw), in one engine: how often a new user's gate passes, not one draw's verdict.
    Each draw's gate is recorded as it is judged, so the record is the last draw's. More than one draw needs a
    toy-world model and no --prompts or --entropy (they name one sample)."""
    registry = settings.registry()
    # A usage error for an unregistered name.
    sample = gate_sample(registry, model, prompts=prompts, count=count, entropy=entropy)
    info = registry.get(model)
    if info.teacher is None:
        raise UsageError(f"--model: {model!r} names no teacher, so it has no distilled gate")
    if draws > 1 and (prompts is not None or entropy is not None or not sample.judged):
        what = ("--prompts names one sample" if prompts is not None else "--entropy names one draw"
                if entropy is not None else f"{model!r} is not a toy-world model, so it has no fresh draws")
        raise UsageError(f"--draws {draws}: {what}")
    engine = Engine(settings.engine_config().exact(), registry, measuring=[model])
    judged = []
    for n in range(draws):
        if n:
            sample = gate_sample(registry, model, prompts=None, count=count)  # a fresh entropy
        if on_model:
            on_model(f"{model} and its teacher {info.teacher}" + (f", draw {n + 1} of {draws}" if draws > 1 else ""))
        judged.append(_judge(settings, engine, model, sample, batch))
    return judged


def _judge(settings: Settings, engine: Engine, model: str, sample: GateSample, batch: int) -> DistilledJudgement:
    registry = engine.registry
    info = registry.get(model)
    teacher_sample = sample.for_model(registry.get(info.teacher))

    def timed(which: GateSample) -> tuple[float, list[np.ndarray]]:
        render_sample(engine, replace(which, items=which.items[:batch]), batch)  # warm-up: its pipeline loaded
        started = time.perf_counter()
        videos = render_sample(engine, which, batch)
        return time.perf_counter() - started, videos

    teacher_s, teacher_videos = timed(teacher_sample)
    student_s, videos = timed(sample)
    clip = teacher_clip = None
    if info.clip is not None:
        scorer = ClipScorer(info.clip)
        prompts_ = [item.case.prompt for item in sample.items]
        clip, teacher_clip = scorer.mean(prompts_, videos), scorer.mean(prompts_, teacher_videos)
    gate = gates.distilled_gate(model, engine.gate_identity(info), info.teacher,
                                adherence=judged_adherence(sample, videos),
                                teacher_adherence=judged_adherence(teacher_sample, teacher_videos), videos=videos,
                                teacher_videos=teacher_videos, batch=batch, speedup=teacher_s / student_s,
                                clip=clip, teacher_clip=teacher_clip, sample=sample.label)
    gates.record(settings.engine.cache_dir, gate)
    return DistilledJudgement(gate, student_s, teacher_s)


def draws_summary(gates: list) -> dict:
    """Several draws' gates of one distilled model: per attribute the teacher's and the student's mean, and the
    student's gap to the teacher (points) as mean, sample standard deviation, smallest and largest; how many passed."""
    per = {}
    for name in ATTRIBUTES:
        if not all(name in g.adherence and name in g.exact_adherence for g in gates):
            continue
        gaps = [100 * (g.adherence[name] - g.exact_adherence[name]) for g in gates]
        per[name] = {"teacher": statistics.fmean(100 * g.exact_adherence[name] for g in gates),
                     "student": statistics.fmean(100 * g.adherence[name] for g in gates),
                     "gap_mean": statistics.fmean(gaps), "gap_sd": statistics.stdev(gaps),
                     "gap_min": min(gaps), "gap_max": max(gaps)}
    return {"model": gates[0].model, "teacher": gates[0].teacher, "count": gates[0].count, "draws_made": len(gates),
            "passed_draws": sum(g.passed for g in gates), "attributes": per,
            "failures": [g.failures for g in gates], "samples": [g.sample for g in gates]}


def evaluate_distilled(settings: Settings, folder: Path, *, quick: bool = False) -> FastResults:
    """`reelbatch toy distill`'s evaluation of the student written to `folder` (as `toy-fast`): its gate on a
    held-out draw of GATE_SAMPLE_SIZE pairs (recorded; seeds nothing in training or in choosing between candidates
    saw), long videos in chunks, decode times and sizes; and its renders of the quality set kept as
    `folder`/references.npz, what `reelbatch quality --model toy-fast` compares byte for byte (a reproduction
    check, not a quality figure). `quick`: 32 pairs, 16 references and 2 long videos."""
    registry = with_folder(settings.registry(), folder)
    engine = Engine(settings.engine_config().exact(), registry, measuring=["toy-fast"])
    entropy = new_entropy()
    held = held_out_set(32 if quick else GATE_SAMPLE_SIZE, entropy)
    shape, fps = native_shape(registry, "toy-fast")
    results, _ = evaluate(engine, "toy-fast", [(c.prompt, c.seed) for c in held],
                          long_cases(2 if quick else LONG_VIDEOS), lambda frames: round_trip(frames, fps),
                          sample=f"{TOY_HELD_OUT}, entropy {entropy}")
    references = sample_set(16 if quick else 80)
    save_references(folder / REFERENCES, shape, references,
                    render(engine, shape, [(c.prompt, c.seed) for c in references]))
    return results


def judge_decoder(settings: Settings, model: str, decoder: Path, *, count: int, entropy: int | None = None):
    """`model` with its light decoder read from `decoder` (`reelbatch toy tune-decoder`'s output) judged against its
    teacher on a held-out draw of `count` pairs, its distilled gate recorded for those files (toyworld.
    distill_report.judge_against_teacher). Returns the gate."""
    registry = settings.registry()
    info = registry.get(model)
    registry = Registry({**registry.models, model: replace(info, decoder=decoder)})
    engine = Engine(settings.engine_config().exact(), registry, measuring=[model])
    entropy = new_entropy() if entropy is None else entropy
    cases = [(c.prompt, c.seed) for c in held_out_set(count, entropy)]
    _, fps = native_shape(registry, model)
    judged = judge_against_teacher(engine, model, cases, lambda frames: round_trip(frames, fps),
                                   sample=f"{TOY_HELD_OUT}, entropy {entropy}")
    return judged.gate
