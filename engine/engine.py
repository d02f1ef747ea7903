"""The engine: loads each registered pipeline once per process and renders same-shape batches to uint8 frames."""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from engine import adapt, denoise, gates, i2v
from engine.chunks import chunk_seed
from engine.config import EngineConfig
from engine.errors import ModelNotFound, RenderError, RenderInterrupted, RetryableRenderError
from engine.experts import ExpertSwap, experts
from engine.fast_ops import use_fast_vae_norm
from engine.first_frame import first_frame_latents
from engine.loading import load_pipeline
from engine.models import ModelInfo, Registry
from engine.stitch import seam_score, stitch
from engine.text_cache import ALL_PARTS, TEXT_PARTS, TextEmbeddingCache, model_identity
from engine.tiny import ensure_builtin
from engine.types import RenderBatch, RenderedVideo, RenderRequest, Shape, add_stages

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, config: EngineConfig, registry: Registry):
        self.config = config
        self.registry = registry
        # Loaded pipelines, least recently used first; at most config.max_models.
        self._pipelines: OrderedDict[str, object] = OrderedDict()
        # A registration's light decoder (engine.light_decoder), used in place of its VAE's decoder.
        self._decoders: dict[str, torch.nn.Module | None] = {}
        # Two-expert models registered with offload_idle_expert: the swap that keeps one expert on the device.
        self.swaps: dict[str, ExpertSwap] = {}
        # The shape of the last batch rendered: a worker prefers more of it (jobs.work.claims.Serving).
        self.last_shape: Shape | None = None
        self._identities: dict[str, str] = {}
        # Shape key -> the largest batch that fitted in device memory, learnt from out-of-memory errors.
        self.max_batch: dict[str, int] = {}
        self.text_cache = TextEmbeddingCache(config.cache_dir / "text-embeddings") if config.text_cache else None
        # Models this engine may render with its lossy accelerators: their recorded gate passed (or, in
        # `reelbatch bench --quality`, they are being measured).
        self.gate_checked: set[str] = set()

    def check_gate(self, name: str) -> None:
        """Refuse (engine.gates.UngatedSetting) the lossy accelerators on a model whose recorded gate did not pass,
        and a distilled registration (one naming a teacher) whose distilled gate did not."""
        info = self.registry.get(name)
        needed = [s for s in (gates.DISTILLED if info.teacher else "", self.config.lossy()) if s]
        if needed and name not in self.gate_checked:
            identity = self.gate_identity(info)
            for setting in needed:
                gates.require(self.config.cache_dir, name, identity, setting)
            self.gate_checked.add(name)

    def model_path(self, info: ModelInfo):
        if info.builtin:
            return ensure_builtin(self.config.cache_dir, info.name)
        whole = info.path is not None and (info.path / "model_index.json").is_file()
        if not whole and not (info.base is not None and info.path is not None and info.path.is_dir()):
            raise ModelNotFound(f"model {info.name!r}: {info.path} holds no model_index.json")
        return info.path

    def loaded(self) -> tuple[str, ...]:
        """The models whose pipelines are loaded, least recently used first."""
        return tuple(self._pipelines)

    def identity(self, info: ModelInfo, parts: tuple[str, ...]) -> str:
        """engine.text_cache.model_identity of the model's `parts`, over its base's too when it has one (a part
        its folder lacks is the base's)."""
        own = model_identity(self.model_path(info), parts)
        return own if info.base is None else f"{own}+{model_identity(info.base, parts)}"

    def gate_identity(self, info: ModelInfo) -> str:
        """What a registration's quality gates are recorded and checked under: engine.adapt.identity (its folder,
        adapters, sampler and decoder), with its base's identity when it has one."""
        own = adapt.identity(info, self.model_path(info))
        return own if info.base is None else f"{own}+{model_identity(info.base, ALL_PARTS)}"

    def pipeline(self, name: str):
        """The loaded pipeline for a registered model: loaded on first use and kept while it is among the
        config.max_models most recently used (loading another unloads the least recently used first)."""
        if name in self._pipelines:
            self._pipelines.move_to_end(name)
        else:
            import diffusers
            import transformers

            diffusers.utils.logging.disable_progress_bar()
            transformers.utils.logging.disable_progress_bar()

            info = self.registry.get(name)
            self.check_gate(name)
            device, dtype = self.config.torch_device(), self.config.torch_dtype()
            path = self.model_path(info)
            # After the checks above, so a model that cannot load unloads none.
            self._make_room(max(self.config.max_models, 1) - 1)
            log.info("loading model %s from %s on %s (%s)", name, path, device, dtype)
            pipe = load_pipeline(info, path, dtype)
            # A registration's adapters fused, its sampler and light decoder (engine.adapt), before compiling.
            self._decoders[name] = adapt.apply(pipe, info, device)
            if info.offload_idle_expert and getattr(pipe, "transformer_2", None) is not None:
                # Both experts stay in CPU memory; the swap brings each to the device for its steps.
                self.swaps[name] = ExpertSwap(pipe, device)
                for component in pipe.components.values():
                    if isinstance(component, torch.nn.Module) and component not in experts(pipe):
                        component.to(device)
            else:
                pipe.to(device)
            if self.config.offloads_text_encoder():
                pipe.text_encoder.to("cpu")  # to the device only to encode what the cache lacks (_embeddings)
            pipe.set_progress_bar_config(disable=True)
            if self.config.fast_vae_norm:
                use_fast_vae_norm(pipe.vae)
            # Every switch on each expert (Wan 2.2 A14B has two transformers).
            if self.config.attention != "native":
                try:
                    for model in experts(pipe):
                        model.set_attention_backend(self.config.attention)
                except (ValueError, RuntimeError, ImportError) as exc:
                    raise RenderError(f"attention backend {self.config.attention!r} cannot run here: {exc}") from None
            if self.config.compile:
                # Set before the first compile; an operator's own TORCHINDUCTOR_CACHE_DIR wins.
                os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(self.config.cache_dir) / "inductor"))
                for model in experts(pipe):
                    model.compile_repeated_blocks(dynamic=False)
            if self.config.step_cache:
                from diffusers.hooks import FirstBlockCacheConfig

                for model in experts(pipe):
                    model.enable_cache(FirstBlockCacheConfig(threshold=self.config.step_cache))
            self._pipelines[name] = pipe
        return self._pipelines[name]

    def light_decoder(self, name: str) -> torch.nn.Module | None:
        """A registration's light decoder (engine.light_decoder), or None where its VAE decodes."""
        self.pipeline(name)
        return self._decoders[name]
    def _make_room(self, keep: int) -> None:
        """Unload the least recently used pipelines until at most `keep` remain, and give their memory back: the
        engine holds the only references, so collecting frees the tensors, and empty_cache returns the freed blocks
        from torch's caching allocator to the device (for another pipeline, or another process)."""
        if len(self._pipelines) <= keep:
            return
        while len(self._pipelines) > keep:
            name, _ = self._pipelines.popitem(last=False)
            self._decoders.pop(name, None)
            self.swaps.pop(name, None)
            log.info("unloading model %s: at most %d loaded (REELBATCH_MAX_MODELS)", name, self.config.max_models)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def render(self, batch: RenderBatch, should_stop: Callable[[], str | None] | None = None) -> list[RenderedVideo]:
        """Render a same-shape batch: text embeddings, denoising, decoding; one generator per video.

        Each video's initial noise comes from its own CPU generator seeded with its seed (diffusers' randn_tensor
        draws per-sample when given a list), so a video renders the same alone or in any batch, on any device.
        `should_stop` is asked after every denoising step; a reason it returns stops the render with
        RenderInterrupted. Out of device memory, the batch is split in half and each half rendered; the largest
        size that fitted is remembered per shape, so later batches of that shape are split before they start.
        """
        key, requests = batch.shape.key(), batch.requests
        limit = self.max_batch.get(key)
        if limit and len(requests) > limit:
            return [video for start in range(0, len(requests), limit)
                    for video in self.render(RenderBatch(batch.shape, requests[start : start + limit]), should_stop)]
        self.last_shape = batch.shape
        try:
            return self._render_once(batch, should_stop)
        except torch.OutOfMemoryError as exc:
            if len(requests) == 1:
                raise RetryableRenderError(f"out of memory rendering 1 x {key}") from exc
            self.max_batch[key] = (len(requests) + 1) // 2
            log.warning("out of memory rendering %d x %s; from now on at most %d at a time", len(requests), key,
                        self.max_batch[key])
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return self.render(batch, should_stop)

    def _render_once(self, batch: RenderBatch, should_stop: Callable[[], str | None] | None) -> list[RenderedVideo]:
        shape, requests = batch.shape, batch.requests
        info = self.registry.get(shape.model)
        pipe = self.pipeline(shape.model)
        _check_shape(pipe, shape)
        generators = [torch.Generator(device="cpu").manual_seed(r.seed) for r in requests]
        clock = _Clock(self.config.torch_device())
        with torch.inference_mode():
            embeds, negative = self._embeddings(shape, info, pipe, requests)
            clock.lap("text")
            # 1. Denoise to latents: the pipeline's image-to-video loop; the engine's loop (WanPipeline's, bit for
            # bit in exact mode; guidance batched, lossy accelerators, first frames and chunk ties, the expert swap);
            # or, for a pipeline it does not know, diffusers' own stopped before decoding.
            config = self.config
            conditions = [r.condition for r in requests]
            _check_images(shape, requests)
            images = self._first_frames(info, pipe, requests)
            chunked = any(c is not None for c in conditions) or any(r.latents_only for r in requests)
            if info.image_condition == "pipeline":
                if config.lossy() or chunked:
                    raise RenderError(f"{shape.model}: lossy settings and long videos are not available on the "
                                      f"pipeline image-to-video path")
                latents = i2v.denoise_i2v(
                    pipe, images=[r.image for r in requests], prompt_embeds=embeds, negative_prompt_embeds=negative,
                    height=shape.height, width=shape.width, frames=shape.frames, steps=shape.steps,
                    guidance=shape.guidance, generators=generators, should_stop=should_stop,
                )
            elif denoise.supports(pipe):
                steps = config.steps_for(shape.steps)
                swap = self.swaps.get(shape.model)
                latents = denoise.denoise(
                    pipe, prompt_embeds=embeds, negative_prompt_embeds=negative, height=shape.height,
                    width=shape.width, frames=shape.frames, steps=steps, guidance=shape.guidance,
                    guidance_2=info.guidance_2, generators=generators, batched_guidance=config.batched_guidance,
                    guidance_steps=config.guided_steps(steps), conditions=conditions,
                    release_sigma=config.chunk_release_sigma, clean_condition=info.chunk_condition == "clean",
                    images=images, should_stop=should_stop, activate=swap.activate if swap else None,
                )
            elif config.lossy() or chunked or images:
                raise RenderError(f"{shape.model}: lossy settings, long videos and first frames need a pipeline "
                                  "engine.denoise supports")
            else:
                latents = pipe(
                    prompt_embeds=embeds,
                    negative_prompt_embeds=negative,
                    height=shape.height,
                    width=shape.width,
                    num_frames=shape.frames,
                    num_inference_steps=shape.steps,
                    guidance_scale=shape.guidance,
                    generator=generators,
                    output_type="latent",
                    max_sequence_length=info.max_sequence_length,
                    callback_on_step_end=_stop_check(should_stop) if should_stop else None,
                ).frames
            clock.lap("denoise")
            # 2. Decode, as WanPipeline.__call__ ends, to uint8 on the device (chunks of a long video keep their
            # latents for the stitch).
            decode = [i for i, r in enumerate(requests) if not r.latents_only]
            videos, finite = (decode_uint8(pipe, latents[decode], self._decoders[shape.model]) if decode
                              else (None, None))
            clock.lap("decode")
        # Same shape, same work: each video's share of the batch's stage times is equal.
        share = {stage: seconds / len(requests) for stage, seconds in clock.laps.items()}
        if videos is not None and videos.shape != (len(decode), shape.frames, shape.height, shape.width, 3):
            raise RenderError(f"pipeline returned frames of shape {videos.shape}, expected "
                              f"{(len(decode), shape.frames, shape.height, shape.width, 3)}")
        out, frames = [], iter(zip(videos, finite) if videos is not None else ())
        for i, request in enumerate(requests):
            if request.latents_only:
                chunk = latents[i].float().cpu()
                bad = None if torch.isfinite(chunk).all() else "render produced non-finite latents (NaN or Inf)"
                out.append(RenderedVideo(request, None, bad, share, latents=None if bad else chunk))
            else:
                out.append(_checked(request, *next(frames), share))
        return out

    def decode(self, model: str, latents: torch.Tensor, request: RenderRequest) -> RenderedVideo:
        """A stitched latent video (C, F, h, w) to uint8 frames, as a batch's decode does (a long video's last
        step). The Wan VAE decodes causally, one latent frame at a time with a feature cache, so its working memory
        does not grow with the video's length; only the output frames do."""
        pipe = self.pipeline(model)
        clock = _Clock(self.config.torch_device())
        with torch.inference_mode():
            (video,), (finite,) = decode_uint8(pipe, latents[None], self._decoders[model])
        clock.lap("decode")
        return _checked(request, video, finite, clock.laps)

    def render_long(self, shape: Shape, request: RenderRequest, chunk_plan) -> tuple[RenderedVideo, list[torch.Tensor]]:
        """A long video in this process, chunk after chunk (each conditioned on the one before), stitched and
        decoded: the reference the job system's chunk-by-chunk path must equal. Returns the video and its chunks'
        latents. `shape` is the window's shape."""
        chunks: list[torch.Tensor] = []
        stages: dict[str, float] = {}
        for k in range(chunk_plan.chunks):
            condition = chunks[-1][:, -chunk_plan.overlap:] if chunks else None
            # The picture starts the first chunk; later ones are tied to the chunk before.
            chunk = replace(request, seed=chunk_seed(request.seed, k), condition=condition, latents_only=True,
                            image=request.image if k == 0 else None)
            (done,) = self.render(RenderBatch(shape, (chunk,)))
            if done.error:
                return RenderedVideo(request, None, f"chunk {k}: {done.error}", stages), chunks
            chunks.append(done.latents)
            stages = add_stages(stages, done.stages)
        return self.finish_long(shape.model, chunks, chunk_plan, request, stages), chunks

    def finish_long(self, model: str, chunks: list[torch.Tensor], chunk_plan, request: RenderRequest,
                    stages: dict[str, float]) -> RenderedVideo:
        """A long video's last step, wherever its chunks were rendered: stitch their latents, decode once, and score
        the seams. `stages` are the chunks' seconds; the decode's are added."""
        video = self.decode(model, stitch(chunks, chunk_plan), request)
        seams = seam_score(video.frames, chunk_plan.seams()) if video.frames is not None else None
        return replace(video, stages=add_stages(stages, video.stages), seam_score=seams)

    def _first_frames(self, info: ModelInfo, pipe, requests) -> list[torch.Tensor] | None:
        """For a first_frame model, each video's picture as its first latent frame (None for a video without one);
        None when no video of the batch has a picture. RenderError for a picture on a model that takes none."""
        if info.image_condition == "pipeline":
            if any(r.image is None for r in requests):
                raise RenderError(f"model {info.name!r} renders from an image: every video needs one")
            return None
        if all(r.image is None for r in requests):
            return None
        if info.image_condition is None:
            raise RenderError(f"model {info.name!r} does not take images (its registration has no image_condition)")
        return [None if r.image is None else first_frame_latents(pipe, r.image) for r in requests]

    def _embeddings(self, shape, info: ModelInfo, pipe, requests) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompt and negative-prompt embeddings, from the cache when it is on; the negative ones only when the
        pipeline guides (WanPipeline guides only above 1.0)."""
        device = self.config.torch_device()

        def encode(texts: list[str]) -> torch.Tensor:
            if not self.config.offloads_text_encoder():
                return pipe.encode_prompt(texts, do_classifier_free_guidance=False,
                                          max_sequence_length=info.max_sequence_length, device=device)[0]
            pipe.text_encoder.to(device)
            try:
                return pipe.encode_prompt(texts, do_classifier_free_guidance=False,
                                          max_sequence_length=info.max_sequence_length, device=device)[0]
            finally:
                pipe.text_encoder.to("cpu")

        def lookup(texts: list[str]) -> torch.Tensor:
            if self.text_cache is None:
                return encode(texts)
            if shape.model not in self._identities:
                self._identities[shape.model] = self.identity(info, TEXT_PARTS)
            return self.text_cache.embeddings(self._identities[shape.model], pipe.text_encoder.dtype,
                                              info.max_sequence_length, texts, encode).to(device)

        prompts = [r.prompt for r in requests]
        negatives = [r.negative_prompt or "" for r in requests]  # WanPipeline's own default negative prompt
        return lookup(prompts), (lookup(negatives) if shape.guidance > 1.0 else None)


def _check_shape(pipe, shape) -> None:
    """What WanPipeline would silently round (frames; sides to the VAE's scale x the patch) or refuse (sides not
    multiples of 16), refused here with the numbers: 16 for Wan 2.1 and 2.2 A14B, 32 for TI2V (16x VAE, 2x2
    patches)."""
    temporal = pipe.vae_scale_factor_temporal
    patch = (pipe.transformer if pipe.transformer is not None else pipe.transformer_2).config.patch_size
    multiple = math.lcm(16, pipe.vae_scale_factor_spatial * patch[1], pipe.vae_scale_factor_spatial * patch[2])
    if shape.height % multiple or shape.width % multiple:
        raise RenderError(f"{shape.width}x{shape.height}: sides must be multiples of {multiple} for {shape.model}")
    if shape.frames % temporal != 1:
        raise RenderError(f"{shape.frames} frames: {shape.model} renders {temporal}k+1 frames")


def _check_images(shape: Shape, requests) -> None:
    """Pictures come fitted to the video's size (engine.images.fit_image); anything else is a caller's bug."""
    for r in requests:
        if r.image is not None and (r.image.shape != (shape.height, shape.width, 3) or r.image.dtype != np.uint8):
            raise RenderError(f"video {r.video_id}: its image is {r.image.dtype} {r.image.shape}, expected uint8 "
                              f"{(shape.height, shape.width, 3)}")


def decode_latents(pipe, latents: torch.Tensor, decoder: torch.nn.Module | None = None) -> np.ndarray:
    """Latents to (B, F, H, W, 3) floats in [0, 1]: the end of diffusers' WanPipeline.__call__ (0.3x-0.4x), op for op,
    so a render split here is bit-identical to one call with output_type="np". A light `decoder`
    (engine.light_decoder) takes the place of `vae.decode`: the same input, the same output range."""
    return pipe.video_processor.postprocess_video(_decode(pipe, latents, decoder), output_type="np")


def decode_uint8(pipe, latents: torch.Tensor, decoder: torch.nn.Module | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Latents to (B, F, H, W, 3) uint8 frames, and per video whether its frames were finite. The conversion runs
    where the decode ran (on a GPU a quarter of the bytes then cross to the host) and computes what the host did
    with decode_latents' frames, np.rint(frames * 255) clipped: the same float32 product and the same rounding (half
    to even), so the same bytes (tested)."""
    video = pipe.video_processor.postprocess_video(_decode(pipe, latents, decoder), output_type="pt").float()
    finite = torch.isfinite(video).flatten(1).all(dim=1)
    frames = (video * 255.0).round_().clamp_(0, 255).to(torch.uint8).permute(0, 1, 3, 4, 2)  # (B, F, H, W, 3)
    return frames.cpu().numpy(), finite.cpu().numpy()


def _decode(pipe, latents: torch.Tensor, decoder: torch.nn.Module | None) -> torch.Tensor:
    """WanPipeline.__call__'s de-normalisation and vae.decode (or the light decoder): (B, 3, F, H, W) in [-1, 1]."""
    vae = pipe.vae
    latents = latents.to(vae.device, vae.dtype)
    view = (1, vae.config.z_dim, 1, 1, 1)
    latents_mean = torch.tensor(vae.config.latents_mean).view(view).to(latents.device, latents.dtype)
    latents_std = 1.0 / torch.tensor(vae.config.latents_std).view(view).to(latents.device, latents.dtype)
    latents = latents / latents_std + latents_mean
    return vae.decode(latents, return_dict=False)[0] if decoder is None else decoder.decode(latents)


class _Clock:
    """Seconds per stage; waits for the device at each lap so queued GPU work is charged to the stage that queued it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.laps[stage] = self.laps.get(stage, 0.0) + now - self._last
        self._last = now


def _stop_check(should_stop: Callable[[], str | None]):
    def on_step_end(pipe, step, timestep, callback_kwargs):
        reason = should_stop()
        if reason:
            raise RenderInterrupted(reason)
        return callback_kwargs

    return on_step_end


def _checked(request, frames: np.ndarray, finite: bool, stages: dict[str, float]) -> RenderedVideo:
    """A video's uint8 frames, refusing output that must never be uploaded."""
    if not finite:
        return RenderedVideo(request, None, "render produced non-finite values (NaN or Inf)", stages)
    if frames.min() == frames.max():
        return RenderedVideo(request, None, f"render produced blank frames (every pixel {int(frames.min())})", stages)
    return RenderedVideo(request, frames, None, stages)
