"""`reelbatch toy tune-decoder`: a distilled toy-world registration's light decoder fine-tuned toward its teacher's
colours (toyworld.tune_decoder), saved, then judged against the teacher on a held-out draw (its gate recorded)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer

from jobs.cli.console import fail, out
from jobs.errors import ReelbatchError, UsageError
from jobs.settings import Settings


def tune_decoder(
    model: Annotated[str, typer.Option("--model", help="A distilled registration with a light decoder, trained "
                                       "on the toy world.")] = "toy-fast",
    out_dir: Annotated[Path, typer.Option("--out", help="Where the tuned decoder folder goes; "
                                          "engine/models/toy-fast/decoder replaces toy-fast's.")] = Path(
        "toy-fast-decoder"),
    steps: Annotated[int, typer.Option("--steps", min=1, max=100_000, help="Fine-tuning steps.")] = 1000,
    pairs: Annotated[int, typer.Option("--pairs", min=16, max=100_000, help="Teacher/student latent pairs "
                                       "rendered to learn from (seeds in training's range).")] = 800,
    count: Annotated[int, typer.Option("--count", min=1, max=100_000, help="Held-out pairs the result is judged "
                                       "on, their seeds drawn afresh.")] = 1200,
    evaluate: Annotated[bool, typer.Option(help="Judge the tuned decoder against the teacher on a held-out draw "
                                           "and record its gate.")] = True,
) -> None:
    """Fine-tune a distilled model's light decoder so its colours and backgrounds match its teacher's: the
    distillation's decoder loss with its colour term, on the student's and the teacher's latents from the same
    noise. Minutes on a CPU for toy-fast."""
    from engine.adapters import light_decoder
    from engine.engine import Engine
    from toyworld.tune_decoder import TuneConfig, tune

    try:
        settings = Settings.from_env()
        registry = settings.registry()
        if model not in registry or registry.get(model).teacher is None or registry.get(model).decoder is None:
            raise UsageError(f"--model: {model!r} is not a registered distilled model with a light decoder "
                             f"(a teacher and a decoder folder)")
        config = dataclasses.replace(TuneConfig(), steps=steps, pairs=pairs)
        engine = Engine(settings.engine_config().exact(), registry, measuring=[model])
        started = time.monotonic()
        decoder, run = tune(engine, model, config, on_log=lambda r: out.print(
            f"{r['stage']} {r['step']}/{r['of']}: loss {r['loss']:.4f}", highlight=False))
        light_decoder.save(decoder, out_dir)
    except (ReelbatchError, ValueError) as exc:
        fail(exc if isinstance(exc, ReelbatchError) else UsageError(str(exc)))
    out.print(f"tuned in {(time.monotonic() - started) / 60:.1f} min ({run['render_s'] / 60:.1f} rendering pairs); "
              f"saved to {out_dir}", highlight=False)
    if not evaluate:
        return
    from jobs.quality.distilled import judge_decoder

    try:
        gate = judge_decoder(settings, model, out_dir, count=count)
    except ReelbatchError as exc:
        fail(exc)
    rows = ", ".join(f"{k} {gate.adherence[k]:.1%} (teacher {gate.exact_adherence[k]:.1%})" for k in gate.adherence)
    out.print(f"held out ({gate.sample}, {gate.count} pairs): {rows}; flicker {gate.flicker:.2f} (teacher "
              f"{gate.teacher_flicker:.2f}); gate {'passed' if gate.passed else 'failed: ' + '; '.join(gate.failures)}",
              highlight=False)
    if not gate.passed:
        raise typer.Exit(1)
