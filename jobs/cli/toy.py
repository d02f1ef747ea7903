"""`reelbatch toy train`, `toy distill`, `toy tune-decoder`, `toy first-frame`, `toy first-frame-vae` and `toy sheet`:
the toy model's training run, its few-step student, its student's decoder tuned toward the teacher's colours
(jobs.cli.toy_tune), toy-i2v's transformer and its VAE (jobs.cli.toy_vae), and a picture of its output.

jobs.cli.app registers them with `app.add_typer(toy_app, name="toy")`.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.console import fail, out, show_progress
from jobs.errors import ReelbatchError, UsageError
from jobs.settings import Settings

toy_app = typer.Typer(help="The toy model: trained here on a procedural world, so its videos can be judged.",
                      no_args_is_help=True)

# A one-minute run for tests and for trying the command: every stage, a few steps each.
QUICK = dict(vae_steps=24, decoder_steps=6, latent_clips=64, steps=30, continuation_steps=6, continuation_clips=32,
             warmup=5, log_every=3, checkpoint_every=10)
QUICK_SAMPLE = 16  # the quick run's evaluation: the sample set's first 16 (every attribute value), not its 80


@toy_app.command("train")
def train(
    out_dir: Annotated[Path, typer.Option("--out", help="Where the trained diffusers folder goes; "
                                          "engine/models/toy replaces the built-in model.")] = Path("toy-model"),
    work: Annotated[Path, typer.Option("--work", help="Checkpoints and the loss log; rerun with the same folder to "
                                       "resume a killed run.")] = Path(".toy-train"),
    quick: Annotated[bool, typer.Option("--quick", help="A one-minute smoke run (a few steps per stage, judged on "
                                        f"{QUICK_SAMPLE} videos).")] = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Default: the committed model's seed.")] = None,
    evaluate: Annotated[bool, typer.Option(help="Judge the result and write references and the model card.")] = True,
) -> None:
    """Train the toy model on CPU: the VAE, then its decoder alone, then the transformer; about an hour on 2
    cores. Writes the diffusers folder, quality references and a model card (README.md) to --out."""
    import torch

    from toyworld.train import TrainConfig
    from toyworld.train import train as run_training

    config = TrainConfig(**QUICK) if quick else TrainConfig()
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)

    try:
        progress = run_training(config, work, out_dir, on_log=show_progress)
    except ValueError as exc:
        fail(UsageError(str(exc)))
    out.print(f"trained in {sum(progress.seconds.values()) / 60:.1f} min of stage time; saved to {out_dir}")
    if not evaluate:
        return
    from jobs.quality.card import evaluate_toy, write_card
    from jobs.quality.sample import SAMPLE_SIZE

    evaluation_started = time.monotonic()
    try:
        results = evaluate_toy(Settings.from_env(), out_dir, QUICK_SAMPLE if quick else SAMPLE_SIZE)
    except ReelbatchError as exc:
        fail(exc)
    write_card(out_dir / "README.md", config=config, progress=progress, results=results,
               machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
                       f"{torch.__version__}, {torch.get_num_threads()} threads",
               evaluation_s=time.monotonic() - evaluation_started)
    out.print(f"model card: {out_dir / 'README.md'}; judged adherence {results.quality.adherence}")


# A one-minute distillation for tests and for trying the command: every stage, a few steps each.
QUICK_DISTILL = dict(samples=80, continuations=16, shard=48, student_steps=12, decoder_steps=6, refine_steps=6,
                     match_steps=4, match_batch=4, match_regression_batch=4,
                     decoder_teacher_samples=32, decoder_student_samples=32, decoder_long_clips=4, warmup=3,
                     log_every=3, checkpoint_every=6)


@toy_app.command("distill")
def distill(
    out_dir: Annotated[Path, typer.Option("--out", help="Where the adapter, light decoder and card go; "
                                          "engine/models/toy-fast replaces the built-in toy-fast.")] = Path(
        "toy-fast-model"),
    work: Annotated[Path, typer.Option("--work", help="Teacher samples, checkpoints and the loss log; rerun with the "
                                       "same folder to resume a killed run.")] = Path(".toy-distill"),
    quick: Annotated[bool, typer.Option("--quick", help="A one-minute smoke run (a few steps per stage).")] = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Default: the committed student's seed.")] = None,
    match_steps: Annotated[Optional[int], typer.Option(
        "--match-steps", help="Steps of the distribution-matching stage after refine (toyworld."
        "distill_match). Default: 400, as the shipped student; 0: none.")] = None,
    evaluate: Annotated[bool, typer.Option(help="Judge the student against `toy`, record its gate, write its "
                                           "card.")] = True,
) -> None:
    """Distil the shipped `toy` into `toy-fast`: a 4-step guidance-free LoRA and a light decoder, on CPU. Writes
    them and a model card (README.md) to --out."""
    import torch

    from engine.models.registry import TOY_WEIGHTS
    from toyworld.distill import DistillConfig
    from toyworld.distill import distill as run_distill

    config = DistillConfig(**QUICK_DISTILL) if quick else DistillConfig()
    if seed is not None:
        config = dataclasses.replace(config, seed=seed)
    if match_steps is not None:
        if match_steps < 0:
            fail(UsageError(f"--match-steps {match_steps}: a number of steps, 0 or more (0: no matching stage)"))
        config = dataclasses.replace(config, match_steps=match_steps)

    started = time.monotonic()
    try:
        progress = run_distill(config, TOY_WEIGHTS, work, out_dir, on_log=show_progress)
    except ValueError as exc:
        fail(UsageError(str(exc)))
    wall_s = time.monotonic() - started
    kept = [v for v in progress.cpu_seconds.values() if v == v]  # nan: a stage run before CPU time was kept
    some = "" if len(kept) == len(progress.cpu_seconds) else " in the stages that kept them"
    out.print(f"distilled in {sum(progress.seconds.values()) / 60:.1f} min of stage time "
              f"({sum(kept) / 60:.1f} CPU-minutes{some}; {wall_s / 60:.1f} min wall for this invocation); "
              f"saved to {out_dir}")
    if not evaluate:
        return
    from jobs.quality.distilled import evaluate_distilled
    from toyworld.distill_card import write_card

    evaluation_started = time.monotonic()
    try:
        results = evaluate_distilled(Settings.from_env(), out_dir, quick=quick)
    except ReelbatchError as exc:
        fail(exc)
    write_card(out_dir / "README.md", config=config, progress=progress, results=results,
               machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
                       f"{torch.__version__}, {torch.get_num_threads()} threads",
               evaluation_s=time.monotonic() - evaluation_started, wall_s=wall_s)
    out.print(f"model card: {out_dir / 'README.md'}; judged adherence {results.student} (teacher "
              f"{results.teacher}); long-video windows {results.long}; gate "
              f"{'passed' if results.gate.passed else 'failed: ' + '; '.join(results.gate.failures)}")


# A one-minute run of the first-frame fine-tune, for tests and for trying the command.
QUICK_FIRST_FRAME = dict(steps=6, clips=64, warmup=2, log_every=3, checkpoint_every=3)


@toy_app.command("first-frame")
def first_frame(
    out_dir: Annotated[Path, typer.Option("--out", help="Where the fine-tuned transformer and the card go; "
                                          "engine/models/toy-i2v is the built-in toy-i2v.")] = Path("toy-i2v"),
    work: Annotated[Path, typer.Option("--work", help="Checkpoints and the loss log; rerun with the same folder to "
                                       "resume a killed run.")] = Path(".toy-i2v"),
    base: Annotated[Optional[Path], typer.Option("--base", help="The toy model to start from (default: the "
                                                 "built-in toy's folder).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A one-minute smoke run (a few steps).")] = False,
    evaluate: Annotated[bool, typer.Option(help="Judge the result and write the model card.")] = True,
) -> None:
    """Fine-tune the toy model's transformer to start videos from a given picture (toy-i2v), on CPU: about 60
    minutes on 2 busy cores. Writes the transformer and a model card (README.md) to --out."""
    import torch

    from engine.models.registry import TOY_WEIGHTS
    from toyworld.train_first_frame import FirstFrameConfig, train_first_frame

    base = base or TOY_WEIGHTS
    if not (base / "model_index.json").is_file():
        fail(UsageError(f"--base: {base} holds no trained toy model (model_index.json); train one with "
                        f"`reelbatch toy train`"))
    config = FirstFrameConfig(**QUICK_FIRST_FRAME) if quick else FirstFrameConfig()

    try:
        progress = train_first_frame(config, base, work, out_dir, on_log=show_progress)
    except ValueError as exc:
        fail(UsageError(str(exc)))
    out.print(f"trained in {sum(progress.seconds.values()) / 60:.1f} min; saved to {out_dir}")
    if not evaluate:
        return
    from jobs.quality.card_i2v import evaluate_toy_i2v, write_i2v_card

    started = time.monotonic()
    try:
        results = evaluate_toy_i2v(Settings.from_env(), out_dir, base)
    except ReelbatchError as exc:
        fail(exc)
    write_i2v_card(out_dir / "README.md", config=config, progress=progress, results=results,
                   machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
                           f"{torch.__version__}, {torch.get_num_threads()} threads",
                   evaluation_s=time.monotonic() - started)
    out.print(f"model card: {out_dir / 'README.md'}; from pictures {results.images.adherence}, first frame "
              f"{results.images.first_frame}", highlight=False)


@toy_app.command("sheet")
def sheet(
    png: Annotated[Path, typer.Option("--out", help="The PNG to write.")] = Path("toy-sheet.png"),
    model: Annotated[Optional[str], typer.Option("--model", help="A registered model trained on the toy world "
                                                 "(default: toy).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, max=200, help="Default: the model's.")] = None,
    scale: Annotated[int, typer.Option("--scale", min=1, max=8, help="Pixels per frame pixel.")] = 2,
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="A prompt per row; repeatable. Default: "
                                                        "8 rows covering every colour, shape, direction and "
                                                        "background.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the first row; each next row adds 1.")] = 1,
    images: Annotated[bool, typer.Option("--images", help="Rows of videos started from pictures of the toy world "
                                         "(8 triples of `quality --images`'s set): the picture, then the frames. "
                                         "Default model: toy-i2v.")] = False,
) -> None:
    """A contact sheet: one row per video, every frame left to right, each labelled with its prompt, as decoded
    from the MP4 a worker would store."""
    from jobs.quality.sheet import contact_sheet, default_prompts

    if images and prompt:
        fail(UsageError("--prompt and --images: the image rows have their own prompts"))
    model = model or ("toy-i2v" if images else "toy")
    try:
        settings = Settings.from_env()
        rows = contact_sheet(settings, model, prompt or default_prompts(), seed=seed, steps=steps, scale=scale,
                             images=images)
        png.parent.mkdir(parents=True, exist_ok=True)
        rows.save(png)
    except ReelbatchError as exc:
        fail(exc)
    out.print(f"wrote {png} ({rows.width}x{rows.height})", highlight=False)


from jobs.cli.toy_tune import tune_decoder  # noqa: E402 (registered here, written apart: toy.py's size)

toy_app.command("tune-decoder")(tune_decoder)

from jobs.cli.toy_vae import first_frame_vae  # noqa: E402 (registered here, written apart: toy.py's size)

toy_app.command("first-frame-vae")(first_frame_vae)
