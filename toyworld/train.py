"""Train the `toy` model on the toy world, on a CPU, resumably.

Stages run in order; each saves a checkpoint into the work folder, so a killed run resumes at the last one:

1. vae: encoder and decoder together on random 9-frame clips, the length rendered: the encoder reads frames in
   chunks of 4 after the first and each chunk sees the cached features of the one before, so a VAE trained on
   5-frame clips (one chunk) returned frames 5-8 with 5-15x the error of frames 0-4. Trained on the posterior mode
   with a small KL term and through an unclamped decode (diffusers' decode clamps to [-1, 1], which would stop
   gradients at saturated pixels). Object, edge and shape-telling pixels (where the other shape would differ) weigh
   more: they are a small share of a frame but all of what the judge reads.
2. decoder: the encoder frozen, the decoder fine-tuned alone, so latents encoded after stage 1 stay valid, on
   33-frame clips: a decoder trained on 9-frame clips only returned frames 9 on with 2.5x the error (its causal
   cache reaches further back than 9 frames, so it had never run without the clip's start in view), which a long
   video's stitched latents run into at once; one trained on 33 frames holds its error to 65 frames.
3. latents: a fixed balanced set of 9-frame clips encoded once, normalised per channel; the statistics go into the
   VAE config, where WanPipeline reads them to de-normalise (its variable named `latents_std` holds 1/std).
4. transformer: flow matching as FlowMatchEulerDiscreteScheduler samples it. The scheduler steps
   `x + (sigma_next - sigma) * v`, so with `x_t = (1 - sigma) * x0 + sigma * noise` the target is
   `v = noise - x0`, at timestep `sigma * 1000` on the shifted sigmas. Prompts are dropped to the empty prompt's
   embedding (what the engine passes as the negative prompt) so classifier-free guidance works. An exponential
   moving average of the weights is what gets saved.
   (Stages 4 and 5 are in toyworld.train_transformer.)
5. continuation: the transformer fine-tuned to continue a clean prefix, as a long video's next chunk is rendered
   (engine.long.chunks, chunk_condition "clean"): on half of each batch, a window starting `window - prefix` latents
   into a longer encoded clip, its first `prefix` latents clean with timestep 0 (per token) and outside the loss; the
   other half is the stage 4 objective, so one window's renders keep what it learnt.
6. export: a diffusers folder (safetensors only) that WanPipeline.from_pretrained loads like any model.

Every random draw comes from a generator seeded with (seed, stage, step), so a resumed run draws what an unbroken
run would have.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from toyworld.model import (
    FRAMES,
    HEIGHT,
    WIDTH,
    build_toy_pipeline,
)
from toyworld.plumbing import (
    STAGES,
    Logger,
    Progress,
    check_config,
    encode_clips,
    optimizer_step,
    resume,
    save_checkpoint,
    stage_rng,
    to_model_space,
    warmup_cosine,
)
from toyworld.train_config import TrainConfig
from toyworld.train_transformer import train_continuation, train_transformer
from toyworld.world import BACKGROUNDS, SHAPES, dataset, dataset_specs, render_clip

log = logging.getLogger(__name__)


def train(config: TrainConfig, work: Path, out: Path, on_log: Callable[[dict], None] | None = None) -> Progress:
    """Run (or resume) every stage in `work`, then write the trained diffusers folder to `out`."""
    work.mkdir(parents=True, exist_ok=True)
    check_config(config, work)
    torch.manual_seed(config.seed)
    pipe = build_toy_pipeline(config.seed)
    logger = Logger(work / "train-log.jsonl", on_log)
    progress = Progress(seconds={}, losses={})
    finished: dict[str, dict] = {}  # each stage's saved state, for the stages after it
    stage_funcs = _stage_funcs()
    for stage in STAGES:
        done = work / f"{stage}.done.pt"
        if done.is_file():
            state = torch.load(done, weights_only=False)
            _restore(pipe, stage, state)
        else:
            state = stage_funcs[stage](pipe, config, work, logger, finished)
            torch.save(state, work / f"{stage}.tmp")
            (work / f"{stage}.tmp").replace(done)
            (work / f"{stage}.last.pt").unlink(missing_ok=True)
        finished[stage] = state
        progress.seconds[stage] = state["seconds"]
        progress.losses[stage] = state.get("loss", float("nan"))
    export(pipe, out)
    return progress


def export(pipe, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)


# ---- stage 1 and 2: the VAE -------------------------------------------------------------------------------------


def _train_vae(pipe, config: TrainConfig, work: Path, logger: "Logger", finished: dict, *,
               stage: str = "vae") -> dict:
    vae = pipe.vae
    decoder_only = stage == "decoder"
    params = list(vae.decoder.parameters()) + list(vae.post_quant_conv.parameters()) if decoder_only \
        else list(vae.parameters())
    vae.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    total = config.decoder_steps if decoder_only else config.vae_steps
    optimizer = torch.optim.AdamW(params, lr=config.vae_lr, weight_decay=0.0)
    schedule = warmup_cosine(optimizer, total, min(config.warmup, total // 10))
    step, seconds = resume(work / f"{stage}.last.pt", vae, optimizer, schedule)
    vae.train()
    started, loss_value = time.monotonic(), float("nan")
    while step < total:
        clips, masks = _vae_batch(config, stage, step)
        with torch.no_grad() if decoder_only else contextlib.nullcontext():
            mean, logvar = vae._encode(clips).chunk(2, dim=1)
        recon = decode_unclamped(vae, mean)
        weight = 1.0 + config.object_weight * masks[0] + config.edge_weight * masks[1] + config.shape_weight * masks[2]
        mse = (weight * (recon - clips) ** 2).mean() / weight.mean()
        kl = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean()
        loss = mse + (0.0 if decoder_only else config.kl_weight * kl)
        optimizer_step(loss, optimizer, params, schedule)
        step += 1
        loss_value = mse.item()
        if step % config.log_every == 0 or step == total:
            logger.log(stage=stage, step=step, of=total, loss=loss_value, kl=kl.item(),
                       seconds=seconds + time.monotonic() - started)
        if step % config.checkpoint_every == 0 and step < total:
            save_checkpoint(work / f"{stage}.last.pt", vae, optimizer, schedule, step,
                            seconds + time.monotonic() - started)
    vae.eval()
    vae.requires_grad_(False)
    return {"vae": vae.state_dict(), "seconds": seconds + time.monotonic() - started, "loss": loss_value}


def _train_decoder(pipe, config, work, logger, finished) -> dict:
    return _train_vae(pipe, config, work, logger, finished, stage="decoder")


def decode_unclamped(vae, z: torch.Tensor) -> torch.Tensor:
    """AutoencoderKLWan._decode without its final clamp to [-1, 1] (diffusers 0.3x-0.4x), frame by frame with the
    causal cache, exactly as inference decodes."""
    vae.clear_cache()
    x = vae.post_quant_conv(z)
    frames = []
    for i in range(x.shape[2]):
        vae._conv_idx = [0]
        frames.append(vae.decoder(x[:, :, i : i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx,
                                  first_chunk=i == 0))
    vae.clear_cache()
    return torch.cat(frames, dim=2)


def _vae_batch(config: TrainConfig, stage: str, step: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    rng = stage_rng(config, stage, step)
    seed = int(rng.integers(2**31))
    batch, frames = (config.decoder_batch, config.decoder_frames) if stage == "decoder" \
        else (config.vae_batch, config.vae_frames)
    specs = list(dataset_specs(batch, seed, width=WIDTH, height=HEIGHT))

    def draw(spec) -> np.ndarray:
        return render_clip(spec, frames=frames, width=WIDTH, height=HEIGHT)

    clips = np.stack([draw(spec) for spec in specs])  # (B, F, H, W, 3)
    backgrounds = np.array([BACKGROUNDS[spec.background] for spec in specs], dtype=np.uint8)
    obj = (clips != backgrounds[:, None, None, None, :]).any(-1)  # (B, F, H, W)
    # The outline: object pixels with a background 4-neighbour, and background pixels with an object one.
    edge = np.zeros_like(obj)
    for axis in (2, 3):
        for shift in (1, -1):
            edge |= obj != np.roll(obj, shift, axis=axis)
    other = np.stack([draw(replace(spec, shape=next(s for s in SHAPES if s != spec.shape))) for spec in specs])
    distinct = (clips != other).any(-1)
    # One random crop per clip, the same window in every frame.
    crop = config.vae_crop
    tops = rng.integers(0, HEIGHT - crop + 1, len(clips))
    lefts = rng.integers(0, WIDTH - crop + 1, len(clips))

    def cut(a: np.ndarray) -> np.ndarray:
        return np.stack([x[:, t : t + crop, l : l + crop] for x, t, l in zip(a, tops, lefts)])

    clips, obj, edge, distinct = cut(clips), cut(obj), cut(edge), cut(distinct)
    masks = tuple(torch.from_numpy(m).float()[:, None] for m in (obj, edge, distinct))  # (B, 1, F, h, w)
    return to_model_space(clips), masks


# ---- stage 3: encoded latents ------------------------------------------------------------------------------------


def _encode_latents(pipe, config: TrainConfig, work: Path, logger: "Logger", finished: dict) -> dict:
    started = time.monotonic()

    def progress(done: int) -> None:
        logger.log(stage="latents", step=done, of=config.latent_clips, seconds=time.monotonic() - started)

    z, prompts = encode_clips(pipe, dataset(config.latent_clips, config.seed, frames=FRAMES, width=WIDTH,
                                             height=HEIGHT), progress)
    channel_mean = z.mean(dim=(0, 2, 3, 4))
    channel_std = z.std(dim=(0, 2, 3, 4))
    # Stored in the config the pipeline reads: latents * std + mean before decoding.
    pipe.vae.register_to_config(latents_mean=channel_mean.tolist(), latents_std=channel_std.tolist())
    view = (1, -1, 1, 1, 1)
    normalised = (z - channel_mean.view(view)) / channel_std.view(view)
    return {
        "latents": normalised,
        "prompts": prompts,
        "latents_mean": channel_mean.tolist(),
        "latents_std": channel_std.tolist(),
        "seconds": time.monotonic() - started,
    }


def _stage_funcs() -> dict[str, Callable]:

    return {"vae": _train_vae, "decoder": _train_decoder, "latents": _encode_latents,
            "transformer": train_transformer, "continuation": train_continuation}


def _restore(pipe, stage: str, state: dict) -> None:
    if stage in ("vae", "decoder"):
        pipe.vae.load_state_dict(state["vae"])
    elif stage == "latents":
        pipe.vae.register_to_config(latents_mean=state["latents_mean"], latents_std=state["latents_std"])
    elif stage in ("transformer", "continuation"):
        pipe.transformer.load_state_dict(state["transformer"])


