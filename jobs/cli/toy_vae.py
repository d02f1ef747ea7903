"""`reelbatch toy first-frame-vae`: toy-i2v's VAE, `toy`'s with its encoder fine-tuned so pictures training never
drew come back as frame 0 (toyworld.train_first_frame_vae), written beside toy-i2v's transformer, then judged on
unseen pictures and on the image set, before and after (jobs.quality.card_vae), and recorded in its card."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from jobs.cli.console import fail, out, show_progress
from jobs.errors import ReelbatchError, UsageError
from jobs.settings import Settings

# A one-minute run, for tests and for trying the command: a few steps, judged on 16 pictures of each set.
QUICK_VAE = dict(steps=6, warmup=2, log_every=3, checkpoint_every=3)
QUICK_COUNT = 16


def first_frame_vae(
    out_dir: Annotated[Path, typer.Option("--out", help="The toy-i2v folder the VAE goes into (as --out/vae, beside "
                                          "its transformer); engine/models/toy-i2v is the built-in toy-i2v.")] = Path(
        "toy-i2v"),
    work: Annotated[Path, typer.Option("--work", help="Checkpoints and the loss log; rerun with the same folder to "
                                       "resume a killed run.")] = Path(".toy-i2v/vae"),
    base: Annotated[Optional[Path], typer.Option("--base", help="The toy model whose VAE is fine-tuned (default: "
                                                 "the built-in toy's folder).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A one-minute smoke run (a few steps, judged on "
                                        f"{QUICK_COUNT} pictures of each set).")] = False,
    evaluate: Annotated[bool, typer.Option(help="Judge toy-i2v before and after on unseen pictures (held-out set) "
                                           "and on the image set, and write the card's VAE section.")] = True,
) -> None:
    """Fine-tune the toy VAE's encoder for toy-i2v on pictures beyond the toy's training (other sizes, sub-pixel
    positions, other shades), on CPU: about 12 minutes on one busy core, then 2 to judge. Writes --out/vae; the
    decoder is toy's, so every frame the transformer draws decodes as before."""
    import torch

    from engine.models.registry import TOY_WEIGHTS
    from toyworld.train_first_frame_vae import FirstFrameVaeConfig, train_first_frame_vae

    base = base or TOY_WEIGHTS
    if not (base / "vae" / "config.json").is_file():
        fail(UsageError(f"--base: {base} holds no trained toy model's VAE (vae/config.json); train one with "
                        f"`reelbatch toy train`"))
    if evaluate and not (out_dir / "transformer" / "config.json").is_file():
        fail(UsageError(f"--out: {out_dir} holds no toy-i2v transformer to judge the VAE with; run `reelbatch toy "
                        f"first-frame --out {out_dir}` first, or pass --no-evaluate"))
    config = FirstFrameVaeConfig(**QUICK_VAE) if quick else FirstFrameVaeConfig()

    try:
        progress = train_first_frame_vae(config, base, work, out_dir, on_log=show_progress)
    except ValueError as exc:
        fail(UsageError(str(exc)))
    out.print(f"trained in {sum(progress.seconds.values()) / 60:.1f} min; saved to {out_dir / 'vae'}",
              highlight=False)
    if not evaluate:
        return
    from jobs.quality.card_vae import evaluate_first_frame_vae, write_vae_section

    started = time.monotonic()
    try:
        results = evaluate_first_frame_vae(Settings.from_env(), out_dir, base, QUICK_COUNT if quick else None)
    except ReelbatchError as exc:
        fail(exc)
    write_vae_section(out_dir / "README.md", config=config, progress=progress, results=results,
                      machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
                              f"{torch.__version__}, {torch.get_num_threads()} threads",
                      evaluation_s=time.monotonic() - started)
    after, before = results.unseen_after, results.unseen_before
    out.print(f"model card: {out_dir / 'README.md'}; unseen pictures (held-out): frame 0 against the picture mean "
              f"{after.first_frame['vs_image_psnr_db_mean']:.1f} dB (before "
              f"{before.first_frame['vs_image_psnr_db_mean']:.1f}), {after.adherence}", highlight=False)
