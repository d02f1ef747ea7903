"""After `reelbatch toy first-frame-vae`: judge `toy-i2v` with its new VAE and, for comparison, with `toy`'s (the
same transformer), on unseen pictures (the held-out set) and on the image set; write the card's VAE section."""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.engine import Engine
from engine.models.registry import TOY_I2V, TOY_WEIGHTS, Registry
from jobs.quality.evaluate import native_shape
from jobs.quality.images import (
    IMAGE_SAMPLE_SIZE,
    UNSEEN_DELTA_E,
    UNSEEN_SIZES,
    UNSEEN_TARGETS,
    ImageQualityReport,
    evaluate_images,
    image_set,
    unseen_set,
)
from jobs.settings import Settings

# The card's section this command writes; `reelbatch toy first-frame` keeps it when it writes the rest of the card.
SECTION = "## The first frame's VAE"
ROWS = ("colour", "shape", "direction", "background", "kept")


@dataclass
class VaeResults:
    unseen_before: ImageQualityReport  # toy-i2v's transformer with toy's VAE, on the held-out unseen pictures
    unseen_after: ImageQualityReport  # with the fine-tuned VAE
    world_before: ImageQualityReport  # the image set (in-distribution pictures), with toy's VAE
    world_after: ImageQualityReport


def evaluate_first_frame_vae(settings: Settings, folder: Path, base: Path = TOY_WEIGHTS,
                             count: int | None = None) -> VaeResults:
    """The four measurements of the card's VAE section, with the configured engine, at the native shape: `folder`
    (transformer and VAE over `base`) and its transformer alone over `base`, each on `count` (default 80) pictures of
    the held-out unseen set and of the image set."""
    count = count or IMAGE_SAMPLE_SIZE
    with tempfile.TemporaryDirectory(prefix="toy-i2v-before-") as before:
        (Path(before) / "transformer").symlink_to((folder / "transformer").resolve(), target_is_directory=True)
        registry = Registry({
            "toy-i2v": dataclasses.replace(TOY_I2V, path=folder, base=base),
            "toy-i2v-toy-vae": dataclasses.replace(TOY_I2V, name="toy-i2v-toy-vae", path=Path(before), base=base),
        })
        engine = Engine(settings.engine_config(), registry)
        shape, fps = native_shape(registry, "toy-i2v")
        old = dataclasses.replace(shape, model="toy-i2v-toy-vae")
        unseen, world = unseen_set(shape.width, shape.height, count), image_set(shape.width, shape.height, count)
        judged = {"targets": UNSEEN_TARGETS, "pictures": "unseen pictures, held-out set"}
        return VaeResults(
            unseen_before=evaluate_images(engine, old, unseen, fps=fps, **judged),
            unseen_after=evaluate_images(engine, shape, unseen, fps=fps, **judged),
            world_before=evaluate_images(engine, old, world, fps=fps),
            world_after=evaluate_images(engine, shape, world, fps=fps),
        )


def write_vae_section(card: Path, *, config, progress, results: VaeResults, machine: str,
                      evaluation_s: float) -> None:
    """Replace (or add) the card's VAE section: how the VAE was trained and the four measurements."""
    text = card.read_text(encoding="utf-8") if card.is_file() else "# Model card: `toy-i2v`\n"
    card.write_text(without_section(text).rstrip("\n") + "\n\n" + vae_section(
        config=config, progress=progress, results=results, machine=machine, evaluation_s=evaluation_s),
        encoding="utf-8")


def without_section(text: str) -> str:
    """`text` less the VAE section (from its heading to the next `## ` heading or the end)."""
    start = text.find(SECTION)
    if start < 0:
        return text
    end = text.find("\n## ", start + len(SECTION))
    return text[:start] + (text[end + 1:] if end >= 0 else "")


def section_of(text: str) -> str:
    """The VAE section of a card's `text` (empty when it has none)."""
    start = text.find(SECTION)
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end + 1] if end >= 0 else text[start:]


def vae_section(*, config, progress, results: VaeResults, machine: str, evaluation_s: float) -> str:
    ub, ua, wb, wa = results.unseen_before, results.unseen_after, results.world_before, results.world_after

    def rows(before: ImageQualityReport, after: ImageQualityReport) -> str:
        return "\n".join(f"| {name} | {before.adherence[name]:.1%} | {after.adherence[name]:.1%} | "
                         f"{'>= ' + format(after.targets[name], '.0%') if name in after.targets else ''} |"
                         for name in ROWS)

    def frame0(before: ImageQualityReport, after: ImageQualityReport, goal: str) -> str:
        b, a = before.first_frame, after.first_frame
        return (f"| frame 0 against the picture, mean | {b['vs_image_psnr_db_mean']:.1f} dB | "
                f"{a['vs_image_psnr_db_mean']:.1f} dB | {goal} |\n"
                f"| frame 0 against the picture, min | {b['vs_image_psnr_db_min']:.1f} dB | "
                f"{a['vs_image_psnr_db_min']:.1f} dB |  |\n"
                f"| frame 0 against the VAE round trip, min | {b['psnr_db_min']:.1f} dB | {a['psnr_db_min']:.1f} dB "
                f"| >= 25 dB |")

    def ceiling(report: ImageQualityReport) -> str:
        f = report.first_frame
        return (f"H.264 alone (each picture held still through the same MP4 round trip, no VAE) gives "
                f"{f['h264_psnr_db_mean']:.1f} dB\non average (min {f['h264_psnr_db_min']:.1f}): the ceiling.")

    settings = "\n".join(f"- `{k}`: {v}" for k, v in dataclasses.asdict(config).items())
    loss = next(iter(progress.losses.values()))
    sizes = " or ".join(f"{low * 100:.0f}-{high * 100:.0f}%" for low, high in UNSEEN_SIZES)
    return f"""{SECTION}

`toy`'s VAE with its encoder fine-tuned (`toyworld/train_first_frame_vae.py`, `vae/` here) so that a picture
training never drew comes back as frame 0: the decoder is `toy`'s, frozen, so every latent the transformer draws
decodes as before (videos from prompts alone are `toy`'s decoder's, byte for byte) and only the picture's latent
moves. Each batch mixes pictures drawn beyond `toy`'s sampling (`toyworld/pictures.py`) with first frames of world
clips, whose latents are held near the old encoder's. Written by `reelbatch toy first-frame-vae` on
{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}; reproduce with:

    reelbatch toy first-frame-vae --out engine/models/toy-i2v --work .toy-i2v/vae

On {machine}: {sum(progress.seconds.values()) / 60:.1f} minutes, last smoothed loss {loss:.4f} (the decode's
squared error, pixels in [-1, 1]); then {evaluation_s / 60:.1f} minutes for the evaluation below.

Settings:
{settings}

### Unseen pictures

{ua.count} pictures of the held-out unseen set (`reelbatch quality --images --unseen`; `jobs/quality/images.py`):
the image set's prompts, each picture one shape of the prompt's colour (a shade
{UNSEEN_DELTA_E[0]:g}-{UNSEEN_DELTA_E[1]:g} CIELAB from the palette colour), shape and background, {sizes} of the
frame's side (training drew 50-56%), at a sub-pixel position with anti-aliased edges; seeds no training or choice
used (the validation set chose this recipe). "toy VAE" is the same transformer with `toy`'s VAE, as shipped before.

| | toy VAE | this VAE | target |
|---|---|---|---|
{frame0(ub, ua, '>= 25 dB')}
{rows(ub, ua)}

{ceiling(ua)}

### The image set (in-distribution pictures)

The {wa.count} triples of `reelbatch quality --images`, the same two ways:

| | toy VAE | this VAE | target |
|---|---|---|---|
{frame0(wb, wa, '')}
{rows(wb, wa)}

{ceiling(wa)}
"""
