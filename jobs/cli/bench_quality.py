"""`reelbatch bench quality`: lossy settings measured against exact mode, or a distilled registration against its
teacher (jobs.bench.quality, jobs.quality.distilled), recorded as gates and printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.progress import Progress, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from jobs.bench.presets import CANDIDATES
from jobs.cli.bench_options import JsonOption
from jobs.cli.console import err, fail, out, progress_text
from jobs.errors import ReelbatchError, UsageError
from jobs.settings import Settings

if TYPE_CHECKING:
    from jobs.bench.quality import QualityBench
    from jobs.quality.distilled import DistilledJudgement


def quality(
    model: Annotated[str, typer.Option(
        "--model", help="A model trained on the toy world, or any registration (judged on --prompts or the shipped "
                        "prompts); a distilled one is judged against its teacher.")] = "toy",
    setting: Annotated[Optional[list[str]], typer.Option(
        "--setting", help="Repeatable: NAME=VALUE[,NAME=VALUE] of step_cache, guidance_fraction, step_scale, "
                          "attention (a sage kernel), ring (Ring attention on that many ranks, started here) "
                          "(default: a measured list).")] = None,
    precision: Annotated[Optional[list[str]], typer.Option(
        "--precision", help="Repeatable: auto, fp32, bf16, fp16, int8-weight, int8, fp8 (engine.levers.precision): measure "
                            "and record the mode's gate (with each --setting if given).")] = None,
    count: Annotated[int, typer.Option("--count", min=1, max=100_000, help="On a toy-world model: how many videos "
                                       "the held-out draw holds (a gate releases a lever on 32 or more; 1200 put "
                                       "the noise of a 2-point margin at half of it, docs/QUALITY.md).")] = 1200,
    entropy: Annotated[Optional[int], typer.Option("--entropy", min=0, max=2**64 - 1, help="On a toy-world model: "
                                                   "render the held-out draw a gate recorded (its `sample` names "
                                                   "the entropy) instead of drawing afresh.")] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="A manifest (YAML or JSONL) whose videos, at their own sizes, steps and seeds, are the "
                          "gate's sample (default: a held-out draw on toy-world models, else the shipped prompts at "
                          "the model's defaults).")] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, max=64, help="Videos per batch.")] = 8,
    draws: Annotated[int, typer.Option("--draws", min=1, max=100, help="A distilled toy-world model: measure its "
                                       "gate on this many fresh held-out draws and say how often it passed (the "
                                       "last draw's gate is recorded).")] = 1,
    json_: JsonOption = False,
) -> None:
    """Render the gate's sample in exact mode and with each lossy setting or precision, judge both, and record which
    pass their gate (mean PSNR >= 25 dB, every video's SSIM >= 0.5, on the toy world adherence within 2 points);
    workers use only those, and only from 32 videos up. With --model of a distilled registration: render it and its
    teacher on the same sample, judge both and record its distilled gate (flicker, motion, blank frames, frozen
    videos; adherence on the toy world, a CLIP score where registered)."""
    bench_quality(model, setting, count, batch, json_, prompts, precision or [], entropy, draws)


def bench_quality(model: str, setting: list[str] | None, count: int, batch: int, json_: bool,
                  prompts: Path | None = None, precision: list[str] = (), entropy: int | None = None,
                  draws: int = 1) -> None:
    try:
        settings = Settings.from_env()
        registry = settings.registry()
    except ReelbatchError as exc:
        fail(exc)
    distilled = model in registry and registry.get(model).teacher is not None
    if distilled and (setting or precision):
        fail(UsageError(f"--setting: {model!r} is distilled; its gate is against its teacher, not a lossy setting"))
    if draws > 1 and not distilled:
        fail(UsageError(f"--draws {draws}: {model!r} is not a distilled registration (--draws measures how often a "
                        f"distilled model's gate passes)"))
    with Progress(progress_text(), TimeElapsedColumn(), console=err, transient=True,
                  disable=json_) as bar:
        task = bar.add_task("bench quality")
        describe = lambda name: bar.update(task, description=f"rendering {name}")  # noqa: E731
        try:
            if distilled:
                from jobs.quality.distilled import judge_draws  # here, not at the top: torch only when rendering

                judged = judge_draws(settings, model, draws=draws, count=count, batch=batch, prompts=prompts,
                                     on_model=describe, entropy=entropy)
            else:
                from jobs.bench.quality import run_quality_bench  # here, not at the top: torch only when rendering

                # --precision alone measures each mode by itself; with --setting, each setting at each mode.
                candidates = setting or ([""] if precision else list(CANDIDATES))
                result = run_quality_bench(settings, model, candidates, count=count, batch=batch,
                                           prompts=prompts, on_setting=describe, precisions=list(precision),
                                           entropy=entropy)
        except ReelbatchError as exc:
            fail(exc)
    if distilled:
        if len(judged) > 1:
            from jobs.quality.distilled import draws_summary

            summary = draws_summary([j.gate for j in judged])
            if json_:
                out.print_json(json.dumps({"draws": [j.to_dict() for j in judged], **summary}))
            else:
                print_draws(summary)
        elif json_:
            out.print_json(json.dumps(judged[0].to_dict()))
        else:
            print_distilled(judged[0])
        return
    if json_:
        out.print_json(json.dumps(result.to_dict()))
    else:
        print_quality_bench(result)


def print_distilled(r: DistilledJudgement) -> None:
    g = r.gate
    from engine.levers.gate_rules import CLIP_MARGIN, MOTION_RATIO

    out.print(Text.assemble(("bench quality", "bold"),
                            f" {g.model} against its teacher {g.teacher}: {g.count} videos each ({g.sample}); "
                            f"{r.student_s:.2f} s against the teacher's {r.teacher_s:.2f} s ({g.speedup:.1f}x)"),
              highlight=False)
    if g.exact_adherence:  # the toy judge read the prompts, after MP4
        table = Table("attribute", g.teacher, g.model, "at least", box=None)
        for name in ("colour", "shape", "direction", "background", "all_four"):
            floor = "" if name == "all_four" else f"{100 * (g.exact_adherence[name] - 0.02):.1f}"
            table.add_row(name, f"{100 * g.exact_adherence[name]:.1f}", f"{100 * g.adherence[name]:.1f}", floor)
        out.print(table)
    if g.clip_score is not None:
        out.print(f"CLIP score {g.clip_score:.2f} (the teacher's {g.teacher_clip_score:.2f}; at most {CLIP_MARGIN:g} "
                  f"below)", highlight=False)
    out.print(f"flicker {g.flicker:.2f} (the teacher's {g.teacher_flicker:.2f}; at most {r.flicker_ratio:g}x); "
              f"motion {g.motion:.2f} (the teacher's {g.teacher_motion:.2f}; at least {MOTION_RATIO:g}x); "
              f"blank frames {g.blank_frames} (the teacher's {g.teacher_blank_frames}); frozen videos "
              f"{g.frozen_videos} (the teacher's {g.teacher_frozen_videos})", highlight=False)
    out.print(f"PSNR against the teacher's renders, for information (another model draws other pixels): mean "
              f"{g.psnr_db_mean:.1f} dB, worst video {g.psnr_db_min:.1f} dB", highlight=False)
    out.print(f"distilled gate {_verdict(g)} (recorded)", highlight=False)


def print_draws(summary: dict) -> None:
    out.print(Text.assemble(("bench quality", "bold"), f" {summary['model']} against its teacher "
                            f"{summary['teacher']}: {summary['draws_made']} fresh draws of {summary['count']} videos; "
                            f"the gate passed on {summary['passed_draws']} of {summary['draws_made']}"),
              highlight=False)
    table = Table("attribute", summary["teacher"], summary["model"], "gap mean", "gap sd", "gap min", "gap max",
                  box=None)
    for name, a in summary["attributes"].items():
        table.add_row(name, f"{a['teacher']:.1f}", f"{a['student']:.1f}", f"{a['gap_mean']:+.2f}",
                      f"{a['gap_sd']:.2f}", f"{a['gap_min']:+.2f}", f"{a['gap_max']:+.2f}")
    out.print(table)
    for n, failures in enumerate(summary["failures"], 1):
        if failures:
            out.print(f"draw {n} failed: {'; '.join(failures)}", highlight=False)
    out.print("the last draw's gate is recorded", highlight=False)


def _verdict(g) -> str:
    from engine.levers.gates import MIN_SAMPLE

    if not g.passed:
        return "FAILED: " + "; ".join(g.failures)
    if not g.releases:
        return f"passed on {g.count} videos, under the {MIN_SAMPLE} that release it: workers still refuse it"
    return "passed: workers may use it"


def print_quality_bench(r: QualityBench) -> None:
    from engine.levers.gates import MIN_SAMPLE
    from jobs.bench.quality import ATTRIBUTES  # the module renders (torch); this only runs after it has

    s = r.shape
    sizes = f"{s['width']}x{s['height']}, {s['frames']} frames, {s['steps']} steps, guidance {s['guidance']:g}"
    if s["shapes"] > 1:
        sizes = f"{s['shapes']} shapes (the first {sizes})"
    out.print(Text("bench quality", style="bold"), f"{r.model}: {r.count} videos ({r.sample}) of {sizes}, batches "
              f"of {r.batch}; exact mode {r.exact_s:.2f} s", highlight=False)
    # Adherence in percent, per attribute, where the toy judge reads the prompts: colour, shape, direction,
    # background, all four.
    judged = bool(r.exact_adherence)
    attributes = ATTRIBUTES if judged else ()
    heads = ("col", "shp", "dir", "bg", "all") if judged else ()
    table = Table("setting", "speed", "PSNR mean/min", "SSIM min", *heads, "gate", box=None)
    pct = lambda x: f"{100 * x:.0f}"  # noqa: E731
    table.add_row("exact", "1.00x", "", "", *(pct(r.exact_adherence[a]) for a in attributes), "")
    for g in r.gates:
        gate = "FAIL" if not g.passed else "pass" if g.releases else f"pass (<{MIN_SAMPLE})"
        table.add_row(g.setting.replace(",", ", "), f"{g.speedup:.2f}x", f"{g.psnr_db_mean:.1f}/{g.psnr_db_min:.1f}",
                      f"{g.ssim_min:.2f}", *(pct(g.adherence[a]) for a in attributes), gate)
    out.print(table)
    for g in r.gates:
        if not g.passed:
            out.print(f"{g.setting}: {'; '.join(g.failures)}", highlight=False)
    if r.count < MIN_SAMPLE:
        out.print(f"{r.count} videos: under the {MIN_SAMPLE} a gate needs to release a lever", highlight=False)
    out.print("recorded; a worker may use: " + (", ".join(g.setting for g in r.gates if g.releases) or "none"),
              highlight=False)
