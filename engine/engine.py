"""The engine: loads each registered pipeline once per process and renders same-shape batches to uint8 frames.

What it leans on is apart: engine.models.pipelines (the loaded-pipeline cache), engine.frames.decode (latents to
frames), engine.frames.checks (what a render refuses) and engine.loop.clock (seconds per stage).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import replace

import torch

from engine.errors import RenderError, RetryableRenderError, UnrenderableInput, device_error
from engine.frames.checks import check_images, check_shape, checked
from engine.frames.decode import decode_uint8
from engine.frames.video_checks import seam_jump
from engine.levers.config import EngineConfig
from engine.levers.text_cache import TextEmbeddingCache
from engine.long.chunks import chunk_seed
from engine.long.stitch import seam_score, stitch
from engine.loop import denoise, i2v, stopping
from engine.loop.clock import StageClock
from engine.loop.conditioning import Conditioning
from engine.loop.experts import ExpertSwap
from engine.loop.first_frame import first_frame_latents
from engine.loop.guidance import Guidance
from engine.models.pipelines import PipelineCache
from engine.models.registry import ModelInfo, Registry
from engine.types import RenderBatch, RenderedVideo, RenderRequest, Shape, add_stages

log = logging.getLogger(__name__)

# Shapes a worker remembers as warm (Engine.warm_shapes): as many as it warms up ahead (jobs.render.serving.warm_up).
WARM_SHAPES = 4


class Engine:
    def __init__(self, config: EngineConfig, registry: Registry, *, measuring: Collection[str] = ()):
        """`measuring`: models rendered to measure their quality gates, whose gates are therefore not asked
        (engine.models.pipelines.PipelineCache.measuring); only the quality bench and `toy distill` pass it."""
        self.config = config
        self.registry = registry
        # The loaded pipelines, their light decoders and expert swaps, and the gates checked before loading.
        self.pipelines = PipelineCache(config, registry, measuring)
        # The last WARM_SHAPES shapes rendered or warmed up, most recent first (the first is `last_shape`): a worker
        # prefers more of them, its compiled graphs and kernels warm (jobs.claims.claims.Serving).
        self.warm_shapes: tuple[Shape, ...] = ()
        self._identities: dict[str, str] = {}
        # Shape key -> the largest batch that fitted in device memory, learnt from out-of-memory errors.
        self.max_batch: dict[str, int] = {}
        self.text_cache = TextEmbeddingCache(config.cache_dir / "text-embeddings") if config.text_cache else None
        # False on a group's other ranks (engine.group.follow): they denoise with rank 0, which alone decodes.
        self.decodes = True

    # The pipeline cache's face on the engine; engine.models.pipelines.PipelineCache says what each one does.

    @property
    def swaps(self) -> dict[str, ExpertSwap]:
        return self.pipelines.swaps

    def check_gate(self, name: str) -> None:
        self.pipelines.check_gate(name)

    def model_path(self, info: ModelInfo):
        return self.pipelines.model_path(info)

    def loaded(self) -> tuple[str, ...]:
        return self.pipelines.loaded()

    def identity(self, info: ModelInfo, parts: tuple[str, ...]) -> str:
        return self.pipelines.identity(info, parts)

    def gate_identity(self, info: ModelInfo) -> str:
        return self.pipelines.gate_identity(info)

    def pipeline(self, name: str):
        return self.pipelines.get(name)

    def light_decoder(self, name: str) -> torch.nn.Module | None:
        return self.pipelines.light_decoder(name)

    @property
    def last_shape(self) -> Shape | None:
        return self.warm_shapes[0] if self.warm_shapes else None

    def remember(self, shape: Shape, instead_of: Shape | None = None) -> None:
        """`shape` is warm here (rendered, or warmed up by jobs.render.serving.warm_up, which rendered `instead_of`,
        its one-step form, forgotten here)."""
        self.warm_shapes = (shape, *(s for s in self.warm_shapes if s not in (shape, instead_of)))[:WARM_SHAPES]

    def render(self, batch: RenderBatch, should_stop: Callable[[], str | None] | None = None) -> list[RenderedVideo]:
        """Render a same-shape batch: text embeddings, denoising, decoding; one generator per video.

        Each video's initial noise comes from its own CPU generator seeded with its seed (diffusers' randn_tensor
        draws per-sample when given a list), so a video renders the same alone or in any batch, on any device.
        `should_stop` is asked after every denoising step; a reason it returns stops the render with
        RenderInterrupted. Out of device memory, the batch is split in half and each half rendered; the largest
        size that fitted is remembered per shape, so later batches of that shape are split before they start.
        A ValueError or RuntimeError (not a device's) raised before the first denoising step is done comes from the
        inputs (the pipeline's checks, a shape the model's tables do not cover): UnrenderableInput, which fails its
        videos at once instead of after every attempt.
        """
        key, requests = batch.shape.key(), batch.requests
        limit = self.max_batch.get(key)
        if limit and len(requests) > limit:
            return [video for start in range(0, len(requests), limit)
                    for video in self.render(RenderBatch(batch.shape, requests[start : start + limit]), should_stop)]
        self.remember(batch.shape)
        stepped: list[int] = []  # one entry per denoising step done, asked with should_stop after each

        def counted() -> str | None:
            stepped.append(1)
            return should_stop() if should_stop is not None else None

        try:
            return self._render_once(batch, counted)
        except torch.OutOfMemoryError as exc:
            if len(requests) == 1:
                raise RetryableRenderError(f"out of memory rendering 1 x {key}") from exc
            self.max_batch[key] = (len(requests) + 1) // 2
            log.warning("out of memory rendering %d x %s; from now on at most %d at a time", len(requests), key,
                        self.max_batch[key])
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except (ValueError, RuntimeError) as exc:
            if stepped or device_error(exc):
                raise  # may pass: retried (jobs.render.attempts.decide)
            raise UnrenderableInput(f"{type(exc).__name__} before the first denoising step of {key}: {exc}") from exc
        return self.render(batch, should_stop)

    def _render_once(self, batch: RenderBatch, should_stop: Callable[[], str | None] | None) -> list[RenderedVideo]:
        shape, requests = batch.shape, batch.requests
        info = self.registry.get(shape.model)
        pipe = self.pipeline(shape.model)
        check_shape(pipe, shape)
        generators = [torch.Generator(device="cpu").manual_seed(r.seed) for r in requests]
        clock = StageClock(self.config.torch_device())
        with torch.inference_mode():
            embeds, negative = self._embeddings(shape, info, pipe, requests)
            clock.lap("text")
            # 1. Denoise to latents: the engine's loop (WanPipeline's, and with a picture's inputs
            # WanImageToVideoPipeline's, bit for bit in exact mode; guidance batched, lossy accelerators, first frames
            # and chunk ties, the expert swap); or, for a pipeline it does not know, diffusers' own stopped before
            # decoding.
            config = self.config
            conditioning = self._conditioning(info, pipe, shape, requests, generators)
            kept: list[torch.Tensor] = []  # each video's noise_kept (engine.loop.denoise.kept), from the loop
            if denoise.supports(pipe):
                steps = config.steps_for(shape.steps)
                swap = self.swaps.get(shape.model)
                guidance = Guidance(shape.guidance, info.guidance_2, config.batched_guidance,
                                    config.guided_steps(steps))
                latents = denoise.denoise(
                    pipe, prompt_embeds=embeds, negative_prompt_embeds=negative, height=shape.height,
                    width=shape.width, frames=shape.frames, steps=steps, generators=generators, guidance=guidance,
                    conditioning=conditioning, should_stop=should_stop, activate=swap.activate if swap else None,
                    noise_kept=kept.append,
                )
            elif config.lossy() or conditioning.any or any(r.latents_only for r in requests):
                raise RenderError(f"{shape.model}: lossy settings, long videos and first frames need a pipeline "
                                  "engine.loop.denoise supports")
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
                    callback_on_step_end=stopping.on_step_end(should_stop) if should_stop else None,
                ).frames
            clock.lap("denoise")
            if not self.decodes:
                return []
            # 2. Decode, as WanPipeline.__call__ ends, to uint8 on the device (chunks of a long video keep their
            # latents for the stitch).
            decode = [i for i, r in enumerate(requests) if not r.latents_only]
            videos, finite = (decode_uint8(pipe, latents[decode], self.light_decoder(shape.model)) if decode
                              else (None, None))
            clock.lap("decode")
        # Same shape, same work: each video's share of the batch's stage times is equal.
        share = {stage: seconds / len(requests) for stage, seconds in clock.laps.items()}
        if videos is not None and videos.shape != (len(decode), shape.frames, shape.height, shape.width, 3):
            raise RenderError(f"pipeline returned frames of shape {videos.shape}, expected "
                              f"{(len(decode), shape.frames, shape.height, shape.width, 3)}")
        out, frames = [], iter(zip(videos, finite) if videos is not None else ())
        noise = kept[0].tolist() if kept else [None] * len(requests)  # None: diffusers' own loop, not measured
        for i, request in enumerate(requests):
            if request.latents_only:
                chunk = latents[i].float().cpu()
                bad = (None if torch.isfinite(chunk).all()
                       else RenderError("render produced non-finite latents (NaN or Inf)"))
                out.append(RenderedVideo(request, None, bad, share, latents=None if bad else chunk,
                                         noise_kept=noise[i]))
            else:
                out.append(replace(checked(request, *next(frames), share), noise_kept=noise[i]))
        return out

    def decode(self, model: str, latents: torch.Tensor, request: RenderRequest) -> RenderedVideo:
        """A stitched latent video (C, F, h, w) to uint8 frames, as a batch's decode does (a long video's last
        step). The Wan VAE decodes causally, one latent frame at a time with a feature cache, so its working memory
        does not grow with the video's length; only the output frames do."""
        pipe = self.pipeline(model)
        clock = StageClock(self.config.torch_device())
        with torch.inference_mode():
            (video,), (finite,) = decode_uint8(pipe, latents[None], self.light_decoder(model))
        clock.lap("decode")
        return checked(request, video, finite, clock.laps)

    def render_long(self, shape: Shape, request: RenderRequest, chunk_plan) -> tuple[RenderedVideo, list[torch.Tensor]]:
        """A long video in this process, chunk after chunk (each conditioned on the one before), stitched and
        decoded: the reference the job system's chunk-by-chunk path must equal. Returns the video and its chunks'
        latents. `shape` is the window's shape."""
        chunks: list[torch.Tensor] = []
        stages: dict[str, float] = {}
        for k in range(chunk_plan.chunks):
            condition = chunks[-1][:, -chunk_plan.overlap:] if chunks else None
            # The picture starts the first chunk; later ones start from the chunk before (tied to its last latents,
            # or on the pipeline image path conditioned on its last frames: engine.loop.i2v).
            chunk = replace(request, seed=chunk_seed(request.seed, k), condition=condition, latents_only=True,
                            image=request.image if k == 0 else None)
            (done,) = self.render(RenderBatch(shape, (chunk,)))
            if done.error:
                return RenderedVideo(request, None, RenderError(f"chunk {k}: {done.error}"), stages), chunks
            chunks.append(done.latents)
            stages = add_stages(stages, done.stages)
        return self.finish_long(shape.model, chunks, chunk_plan, request, stages, done.noise_kept), chunks

    def finish_long(self, model: str, chunks: list[torch.Tensor], chunk_plan, request: RenderRequest,
                    stages: dict[str, float], noise_kept: float | None = None) -> RenderedVideo:
        """A long video's last step, wherever its chunks were rendered: stitch their latents, decode once, and score
        the seams. `stages` are the chunks' seconds; the decode's are added. `noise_kept`: the last chunk's (the
        one in hand where the job path stitches; every chunk is denoised by the same model)."""
        video = self.decode(model, stitch(chunks, chunk_plan), request)
        seams = seam_score(video.frames, chunk_plan.seams()) if video.frames is not None else None
        jump = seam_jump(video.frames, chunk_plan.seams()) if video.frames is not None else None
        return replace(video, stages=add_stages(stages, video.stages), seam_score=seams, seam_jump=jump,
                       noise_kept=noise_kept)

    def _conditioning(self, info: ModelInfo, pipe, shape: Shape, requests, generators) -> Conditioning:
        """What the batch's videos start from besides their text (engine.loop.conditioning): a long video's chunk tied
        to the chunk before, a first frame, or on the pipeline image path WanImageToVideoPipeline's inputs (its
        noise, mask and picture channels, image embedding), read by the one loop as one of its steps. There a long
        video's later chunk is conditioned through the same channels on the chunk before's last frames (engine.loop.i2v
        says why), not tied."""
        conditions = [r.condition for r in requests]
        check_images(shape, requests)
        images = self._first_frames(info, pipe, requests)
        if info.image_condition == "pipeline":
            return Conditioning(picture=i2v.prepare(pipe, [r.image for r in requests], shape.height, shape.width,
                                                    shape.frames, generators, tails=conditions))
        return Conditioning(conditions=conditions, release_sigma=self.config.chunk_release_sigma,
                            clean_condition=info.chunk_condition == "clean", images=images)

    def _first_frames(self, info: ModelInfo, pipe, requests) -> list[torch.Tensor] | None:
        """For a first_frame model, each video's picture as its first latent frame (None for a video without one);
        None when no video of the batch has a picture. RenderError for a picture on a model that takes none."""
        if info.image_condition == "pipeline":
            # A long video's later chunks start from the chunk before (their condition) instead.
            if any(r.image is None and r.condition is None for r in requests):
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
                self._identities[shape.model] = self.pipelines.text_identity(info)  # an 8-bit encoder's own
            return self.text_cache.embeddings(self._identities[shape.model], pipe.text_encoder.dtype,
                                              info.max_sequence_length, texts, encode).to(device)

        prompts = [r.prompt for r in requests]
        negatives = [r.negative_prompt or "" for r in requests]  # WanPipeline's own default negative prompt
        return lookup(prompts), (lookup(negatives) if shape.guidance > 1.0 else None)

