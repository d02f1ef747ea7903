"""`reelbatch quality --images`: does a toy-world model that takes a first frame start from it, and keep it?

A fixed set of image/prompt/seed triples: each image is a picture of the toy world (one shape at a seeded position)
whose colour, shape and background are the prompt's, so a video that keeps the image and follows the prompt keeps
all four. Each video goes through the real engine (same-shape batches, the image as its first latent frame), is
encoded to MP4 and decoded back, and is judged from its pixels:

- first frame: PSNR of the video's frame 0 against the image after the VAE round trip (encoded and decoded, what
  the model can give back at best), >= 25 dB in every video; against the image itself it is reported too;
- kept: the object keeps the image's colour and shape and moves in the prompt's direction, >= 90% of videos;
- background: kept, >= 95% of videos.

With `--unseen`, the pictures are ones training never drew (toyworld.pictures: other sizes, sub-pixel positions
with anti-aliased edges, other shades of the palette colours; issue 46), and the targets are UNSEEN_TARGETS: frame
0 at least 25 dB from the picture itself on average, colour, direction and background kept in 95% of videos. Both
sets report what H.264 alone costs (the picture held still through the same MP4 round trip): the ceiling of frame
0 against the picture.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from engine.engine import Engine
from engine.frames.decode import decode_latents
from engine.frames.metrics import psnr
from engine.loop.first_frame import first_frame_latents
from engine.types import RenderBatch, RenderRequest, Shape
from jobs.errors import UsageError
from jobs.quality.evaluate import native_shape, round_trip
from jobs.quality.sample import sample_set
from jobs.settings import Settings
from toyworld.judge import judge_clip
from toyworld.pictures import PictureSpec, render_picture, sample_picture
from toyworld.world import parse_prompt, render_clip, sample_spec

IMAGE_SAMPLE_SIZE = 80
IMAGE_SEED_BASE = 9000
# Issue 21's targets: frame 0 within 25 dB of the image after the VAE round trip (every video), colour, shape and
# direction kept together in 90% of videos, the background in 95%.
IMAGE_TARGETS = {"first_frame_psnr_db": 25.0, "kept": 0.90, "background": 0.95}


# Unseen pictures (issue 46): what a user's picture of the toy world may be and training never drew
# (toyworld.pictures). Sizes as shares of the shorter side, both sides of training's 0.50-0.56 (toyworld.world.
# SIZE_RANGE): 9.6-15.0 px and 18.9-22.1 px at 32x32; the larger stays inside the judge's 66% window with room for
# blur. Shades 3-10 CIELAB from the palette colour: never an exact palette colour, and far enough inside the judge's
# 16 that the VAE's and H.264's own shifts (2-8 on the image set) leave it readable.
UNSEEN_SIZES = ((0.30, 0.47), (0.59, 0.69))
UNSEEN_DELTA_E = (3.0, 10.0)
# Seeds of the two unseen sets, case i taking base + i: above every range the project draws or keeps (training
# [10^6, 2^31), held-out gates [2^32, 2^40): jobs.quality.sample), 2^20 apart so the sets never meet. The validation
# set chooses recipes (toy-i2v's VAE: docs/TOY_TRAINING.md); the held-out set only reports.
UNSEEN_SEEDS = {"validation": 2**40, "held-out": 2**40 + 2**20}
# Issue 46's targets on unseen pictures: frame 0 at least 25 dB from the picture itself on average, and from its VAE
# round trip in every video (as on the image set), colour and direction kept (the quality targets' 95%), and the
# background. Shape and kept are reported beside them: squares of 10 px lose their corners to the VAE's 4x4 cells.
UNSEEN_TARGETS = {"vs_image_psnr_db_mean": 25.0, "first_frame_psnr_db": 25.0, "colour": 0.95, "direction": 0.95,
                  "background": 0.95}


@dataclass(frozen=True)
class ImageCase:
    prompt: str
    seed: int  # draws the image's shape size and position, and the video's noise
    image: np.ndarray = field(compare=False, repr=False)  # uint8 (H, W, 3)


def image_set(width: int, height: int, count: int = IMAGE_SAMPLE_SIZE) -> list[ImageCase]:
    """The first `count` triples: the quality set's prompts in its order (each of the 80 once in any 80, every
    attribute value in any 16), seeds IMAGE_SEED_BASE + i, each image the first frame of a world clip drawn with
    the prompt's colour, shape and background."""
    cases = []
    for i, case in enumerate(sample_set(count)):
        seed = IMAGE_SEED_BASE + i
        spec = sample_spec(seed, width=width, height=height, **parse_prompt(case.prompt))
        cases.append(ImageCase(case.prompt, seed, render_clip(spec, frames=1, width=width, height=height)[0]))
    return cases


def unseen_specs(width: int, height: int, count: int = IMAGE_SAMPLE_SIZE,
                 split: str = "held-out") -> list[tuple[str, int, PictureSpec]]:
    """The first `count` unseen (prompt, seed, picture) of `split` ("validation" or "held-out"): image_set's prompts
    in its order, seeds UNSEEN_SEEDS[split] + i, each picture drawn by toyworld.pictures from its seed with the
    prompt's colour (a shade of it), shape and background, a size in UNSEEN_SIZES and a sub-pixel position."""
    if split not in UNSEEN_SEEDS:
        raise ValueError(f"split must be one of {', '.join(UNSEEN_SEEDS)}, got {split!r}")
    short = min(width, height)
    sizes = tuple((low * short, high * short) for low, high in UNSEEN_SIZES)
    specs = []
    for i, case in enumerate(sample_set(count)):
        seed = UNSEEN_SEEDS[split] + i
        wanted = parse_prompt(case.prompt)
        specs.append((case.prompt, seed, sample_picture(
            seed, width=width, height=height, sizes=sizes, delta_e=UNSEEN_DELTA_E, colour=wanted["colour"],
            shape=wanted["shape"], background=wanted["background"])))
    return specs


def unseen_set(width: int, height: int, count: int = IMAGE_SAMPLE_SIZE, split: str = "held-out") -> list[ImageCase]:
    """unseen_specs' triples with their pictures drawn: image/prompt/seed triples as image_set's, the seed also
    seeding the video's noise."""
    return [ImageCase(prompt, seed, render_picture(spec, width=width, height=height))
            for prompt, seed, spec in unseen_specs(width, height, count, split)]


@dataclass
class ImageQualityReport:
    model: str
    pictures: str  # which set: "the image set", "unseen pictures, held-out set" or "..., validation set"
    shape: dict
    count: int
    adherence: dict[str, float]  # colour, shape, direction, background, kept (the first three together)
    first_frame: dict[str, float]  # PSNR of frame 0 against the VAE round trip and the image; H.264's alone
    targets: dict[str, float]
    meets_targets: bool
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.meets_targets

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def render_image_cases(engine: Engine, shape: Shape, cases: list[ImageCase], batch: int,
                       on_batch: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Raw uint8 frames for each triple, in batches of up to `batch` through Engine.render."""
    videos: list[np.ndarray] = []
    for start in range(0, len(cases), batch):
        chunk = cases[start : start + batch]
        requests = tuple(RenderRequest(start + i, c.prompt, None, c.seed, image=c.image) for i, c in enumerate(chunk))
        for rendered in engine.render(RenderBatch(shape, requests)):
            if rendered.frames is None:
                raise RuntimeError(f"{rendered.request.prompt!r} (seed {rendered.request.seed}): {rendered.error}")
            videos.append(rendered.frames)
        if on_batch:
            on_batch(len(chunk))
    return videos


def vae_round_trip(pipe, image: np.ndarray) -> np.ndarray:
    """The image encoded as a first frame and decoded, uint8 (H, W, 3): the best frame 0 the model can give back."""
    with torch.inference_mode():
        frames = decode_latents(pipe, first_frame_latents(pipe, image)[None])[0]
    return np.clip(np.rint(np.asarray(frames)[0] * 255.0), 0, 255).astype(np.uint8)


def evaluate_images(engine: Engine, shape: Shape, cases: list[ImageCase], *, fps: int, batch: int = 8,
                    targets: dict[str, float] = IMAGE_TARGETS, pictures: str = "the image set",
                    on_batch: Callable[[int], None] | None = None) -> ImageQualityReport:
    started = time.monotonic()
    videos = [round_trip(v, fps) for v in render_image_cases(engine, shape, cases, batch, on_batch)]
    pipe = engine.pipeline(shape.model)
    hits = {name: 0 for name in ("colour", "shape", "direction", "background", "kept")}
    against_vae, against_image, h264 = [], [], []
    for case, video in zip(cases, videos):
        agree = judge_clip(video).matches(case.prompt)
        for name in ("colour", "shape", "direction", "background"):
            hits[name] += agree[name]
        hits["kept"] += agree["colour"] and agree["shape"] and agree["direction"]
        against_vae.append(psnr(video[:1], vae_round_trip(pipe, case.image)[None]))
        against_image.append(psnr(video[:1], case.image[None]))
        # What H.264 alone costs: the picture held for the video's length through the same MP4 round trip.
        h264.append(psnr(round_trip(np.repeat(case.image[None], len(video), axis=0), fps)[:1], case.image[None]))
    adherence = {name: n / len(cases) for name, n in hits.items()}
    first_frame = {"psnr_db_min": float(min(against_vae)), "psnr_db_mean": float(np.mean(against_vae)),
                   "vs_image_psnr_db_min": float(min(against_image)),
                   "vs_image_psnr_db_mean": float(np.mean(against_image)),
                   "h264_psnr_db_min": float(min(h264)), "h264_psnr_db_mean": float(np.mean(h264))}
    return ImageQualityReport(
        model=shape.model, pictures=pictures,
        shape={"width": shape.width, "height": shape.height, "frames": shape.frames, "steps": shape.steps,
               "guidance": shape.guidance, "fps": fps},
        count=len(cases), adherence=adherence, first_frame=first_frame, targets=dict(targets),
        meets_targets=all(reading(name, adherence, first_frame) >= goal for name, goal in targets.items()),
        seconds=time.monotonic() - started,
    )


def reading(target: str, adherence: dict[str, float], first_frame: dict[str, float]) -> float:
    """The figure a target is set on: an adherence share, a first-frame PSNR by its name, or (the image set's
    `first_frame_psnr_db`) the least PSNR against the picture's VAE round trip."""
    if target == "first_frame_psnr_db":
        return first_frame["psnr_db_min"]
    return adherence[target] if target in adherence else first_frame[target]


def run_image_quality(settings: Settings, model: str, *, steps: int | None, guidance: float | None, count: int,
                      batch: int, unseen: str | None = None,
                      on_batch: Callable[[int], None] | None = None) -> ImageQualityReport:
    """`reelbatch quality --images`: the image set (or, with `unseen` "held-out" or "validation", that set of
    unseen pictures) rendered by an engine on `settings`' switches, and judged against its targets."""
    registry = settings.registry()
    shape, fps = native_shape(registry, model, steps=steps, guidance=guidance)
    if registry.get(model).image_condition is None:
        takers = [n for n in registry.names() if registry.get(n).image_condition]
        raise UsageError(f"--model: {model!r} does not take images (models that do: {', '.join(takers)})")
    engine = Engine(settings.engine_config(), registry)
    if unseen is None:
        return evaluate_images(engine, shape, image_set(shape.width, shape.height, count), fps=fps, batch=batch,
                               on_batch=on_batch)
    return evaluate_images(engine, shape, unseen_set(shape.width, shape.height, count, unseen), fps=fps,
                           batch=batch, targets=UNSEEN_TARGETS, pictures=f"unseen pictures, {unseen} set",
                           on_batch=on_batch)
