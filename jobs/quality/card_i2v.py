"""After `reelbatch toy first-frame`: judge `toy-i2v` (and, for comparison, `toy` taking a first frame through the
same path before the fine-tune) on the image set, judge its text-only videos on the quality set, write its card."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from engine.engine import Engine
from engine.models.registry import TOY, TOY_I2V, TOY_WEIGHTS, Registry
from jobs.quality.card_vae import section_of
from jobs.quality.evaluate import QualityReport, evaluate, native_shape
from jobs.quality.images import IMAGE_SAMPLE_SIZE, ImageQualityReport, evaluate_images, image_set
from jobs.quality.sample import SAMPLE_SIZE, sample_set
from jobs.settings import Settings


@dataclass
class I2VResults:
    images: ImageQualityReport  # toy-i2v on the image set
    before: ImageQualityReport  # toy, not fine-tuned, on the image set through the same first-frame path
    text: QualityReport  # toy-i2v from prompts alone, on the quality set


def evaluate_toy_i2v(settings: Settings, folder: Path, base: Path = TOY_WEIGHTS) -> I2VResults:
    """The three measurements of the card, with the configured engine, at the native shape."""
    registry = Registry({
        "toy-i2v": dataclasses.replace(TOY_I2V, path=folder, base=base),
        "toy-first-frame": dataclasses.replace(TOY, name="toy-first-frame", path=base, image_condition="first_frame"),
    })
    engine = Engine(settings.engine_config(), registry)
    shape, fps = native_shape(registry, "toy-i2v")
    cases = image_set(shape.width, shape.height, IMAGE_SAMPLE_SIZE)
    images = evaluate_images(engine, shape, cases, fps=fps)
    before = evaluate_images(engine, dataclasses.replace(shape, model="toy-first-frame"), cases, fps=fps)
    text = evaluate(engine, shape, sample_set(SAMPLE_SIZE), fps=fps)
    return I2VResults(images, before, text)


def write_i2v_card(path: Path, *, config, progress, results: I2VResults, machine: str, evaluation_s: float) -> None:
    after, before, text = results.images, results.before, results.text
    rows = "\n".join(
        f"| {name} | {before.adherence[name]:.1%} | {after.adherence[name]:.1%} | "
        f"{'>= ' + format(after.targets[name], '.0%') if name in after.targets else ''} |"
        for name in ("colour", "shape", "direction", "background", "kept")
    )
    text_rows = "\n".join(f"| {name} | {text.adherence[name]:.1%} | "
                          f"{'>= ' + format(text.targets[name], '.0%') if name in text.targets else ''} |"
                          for name in ("colour", "shape", "direction", "background", "all_four"))
    settings = "\n".join(f"- `{k}`: {v}" for k, v in dataclasses.asdict(config).items())
    minutes = sum(progress.seconds.values()) / 60
    loss = next(iter(progress.losses.values()))
    a, b, s = after.first_frame, before.first_frame, after.shape
    if (path.parent / "vae" / "config.json").is_file():
        here = ("The transformer and the VAE (`toy`'s with its encoder fine-tuned: \"The first frame's VAE\", below) "
                "are here; the\ntext encoder, tokenizer and scheduler are `toy`'s, loaded from its folder (`base`).")
    else:
        here = ("Only the transformer is here; the VAE, text encoder, tokenizer and scheduler are `toy`'s, loaded from "
                "its folder\n(`base`).")
    kept = section_of(path.read_text(encoding="utf-8")) if path.is_file() else ""
    body = f"""# Model card: `toy-i2v`

`toy` (its card: `engine/models/toy/README.md`) with its transformer fine-tuned to start a video from a given
picture: a picture of the toy world (one circle or square of a palette colour on black or gray) and a prompt of
the toy grammar whose colour, shape and background are the picture's. The picture, VAE-encoded, is the video's first
latent frame, held clean with timestep 0 on its tokens (`image_condition: first_frame`, as Wan 2.2 TI2V
conditions); the object keeps its colour and shape and moves in the prompt's direction.
{here}

Written by `reelbatch toy first-frame` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d}. Reproduce with:

    reelbatch toy first-frame --out engine/models/toy-i2v --work .toy-i2v

## Training

From `toy`'s weights, one stage (`toyworld/train_first_frame.py`): each batch mixes windows whose first latent
is clean (a first frame), windows continuing a clean 2-latent prefix (long videos' chunks, as `toy`'s stage 5) and
plain windows (prompts alone). On {machine}: {minutes:.1f} minutes (encoding its clips included), last smoothed
loss {loss:.4f}; then {evaluation_s / 60:.1f} minutes for the evaluation below.

Settings:
{settings}

## Evaluation: videos from pictures

{after.count} image/prompt/seed triples (`jobs/quality/images.py`: the quality set's prompts, each picture the first
frame of a world clip drawn with the prompt's colour, shape and background at a seeded size and position), rendered
at {s['width']}x{s['height']}, {s['frames']} frames, {s['steps']} steps, guidance {s['guidance']:g}, and judged
from pixels after H.264 encoding and decoding (`toyworld/judge.py`). "kept" is colour, shape and direction at once.
"toy" is the shipped `toy` taking the same pictures through the same path, before this fine-tune.

| attribute | toy | toy-i2v | target |
|---|---|---|---|
{rows}

Frame 0 against the picture after the VAE round trip (encoded and decoded: the best the model can give back): PSNR
min {a['psnr_db_min']:.1f} dB, mean {a['psnr_db_mean']:.1f} (target >= 25 dB in every video; toy: min
{b['psnr_db_min']:.1f}). Against the picture itself: min {a['vs_image_psnr_db_min']:.1f} dB, mean
{a['vs_image_psnr_db_mean']:.1f}; what is lost there is the VAE's (a 32x32 picture encoded to 8x8 latent cells) and
H.264's, not the conditioning's.

Meets the targets: {'yes' if after.meets_targets else 'no'}. Measure again with `reelbatch quality --images`.

## Evaluation: videos from prompts alone

The {text.count} prompt/seed pairs of `reelbatch quality`, no picture:

| attribute | toy-i2v | target |
|---|---|---|
{text_rows}

## Limits

- Only the toy grammar and toy-world pictures: a photograph gives some shape of some colour moving somewhere.
- A prompt whose colour or shape differs from the picture's: the picture wins in the first frames; untested after.
- Trained at 32x32 and 9 frames; longer videos are made in chunks, the picture starting the first.
"""
    # `reelbatch toy first-frame-vae`'s section, when it has written one, stays.
    path.write_text(body + ("\n" + kept if kept else ""), encoding="utf-8")
