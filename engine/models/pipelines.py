"""The loaded-pipeline cache: a registered model's folder found, its gates checked, its pipeline loaded with the
engine's switches (adapters, expert swap, precision, attention backend, compile, step cache), and at most
config.max_models of them kept, the least recently used unloaded first.

Apart from engine.engine (which renders batches with what this hands it) so that where a model comes from and how
long it stays in memory read in one place.
"""

from __future__ import annotations

import gc
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Collection
from pathlib import Path

import torch

from engine import parallel
from engine.adapters import apply as adapt
from engine.errors import ModelNotFound, RenderError
from engine.levers import content_key, gates, precision
from engine.levers.config import EngineConfig
from engine.levers.fast_ops import use_fast_vae_norm
from engine.levers.precision import PrecisionRefused
from engine.levers.text_cache import TEXT_PARTS, model_identity
from engine.loop.experts import ExpertSwap, experts
from engine.models.loading import load_pipeline
from engine.models.registry import ModelInfo, Registry
from engine.models.tiny import ensure_builtin

log = logging.getLogger(__name__)


class PipelineCache:
    def __init__(self, config: EngineConfig, registry: Registry, measuring: Collection[str] = ()):
        self.config = config
        self.registry = registry
        # Loaded pipelines, least recently used first; at most config.max_models.
        self._pipelines: OrderedDict[str, object] = OrderedDict()
        # A registration's light decoder (engine.adapters.light_decoder), used in place of its VAE's decoder.
        self._decoders: dict[str, torch.nn.Module | None] = {}
        # Two-expert models registered with offload_idle_expert: the swap that keeps one expert on the device.
        self.swaps: dict[str, ExpertSwap] = {}
        # Models rendered to measure them (`reelbatch bench`, `toy distill`'s evaluation): their gates are not asked,
        # since measuring is what records them. Fixed when the engine is made; a worker's engine
        # (jobs.render.batch) is made without any, so only a passing gate lets a worker use a lever.
        self.measuring = frozenset(measuring)
        # Models whose gates passed when this engine first loaded them: asked once per engine.
        self._gates_passed: set[str] = set()
        self._gate_keys: dict[str, str] = {}
        # Called as a model starts to load, with the names still loaded (engine.group: the other ranks load it too).
        self.before_load: Callable[[str, tuple[str, ...]], None] | None = None

    def native(self, device_type: str | None = None) -> str:
        """The native precision (engine.levers.precision.native): of the config's dtype, on `device_type` where given
        (so a caller that must not touch CUDA need not), else on the config's device."""
        if device_type is not None and self.config.dtype == "auto":
            return "bf16" if device_type == "cuda" else "fp32"
        return precision.native(self.config.torch_dtype())

    def precision(self, name: str, device_type: str | None = None) -> str:
        """The precision a registered model renders at here (engine.levers.precision), `auto` resolved: fp32, bf16,
        fp16, int8-weight, int8 or fp8."""
        mode = precision.mode_for(self.config.precision, self.registry.get(name).precision)
        return precision.resolve(mode, self.native(device_type))

    def text_encoder_precision(self, name: str, device_type: str | None = None) -> str | None:
        """The text encoder's own precision here (engine.levers.precision.text_encoder_mode), `auto` resolved; None: as
        the pipeline."""
        mode = precision.text_encoder_mode(self.config.text_encoder_precision,
                                           self.registry.get(name).text_encoder_precision)
        return None if mode is None else precision.resolve(mode, self.native(device_type))

    def gate_setting(self, name: str, device_type: str | None = None) -> str:
        """What the model's lossy gate is keyed by here: the lossy accelerators and a precision below native (the
        text encoder's own, the pipeline's)."""
        return precision.gate_setting(self.config.lossy(), self.precision(name, device_type), self.native(device_type),
                                      self.text_encoder_precision(name, device_type))

    def text_identity(self, info: ModelInfo) -> str:
        """What the text-embedding cache keys a model's embeddings by: its text encoder's files, and an 8-bit text
        encoder's mode (its dtype, also in the key, is the float type it computes in, the same as exact mode's)."""
        own = self.identity(info, TEXT_PARTS)
        mode = self.text_encoder_precision(info.name)
        return f"{own}+{mode}" if mode in precision.EIGHT_BIT else own

    def check_precision(self, name: str, facts: tuple[str, tuple[int, int] | None] | None = None) -> None:
        """Refuse (engine.levers.precision.PrecisionRefused) a precision this device cannot run, and (UngatedSetting)
        one below native without its passing gate. `facts`: the device's type and CUDA capability
        (engine.levers.precision.device_facts), for a caller that must not initialise CUDA (a prefork worker's parent);
        None: asked here."""
        if facts is None:
            device = self.config.torch_device()
            facts = (device.type, torch.cuda.get_device_capability(device) if device.type == "cuda" else None)
        mode = self.precision(name, facts[0])
        problem = precision.device_problem(mode, *facts)
        if problem is not None:
            raise PrecisionRefused(f"model {name!r}: precision {mode} cannot run here: {problem}")
        text = self.text_encoder_precision(name, facts[0])
        problem = None if text is None else precision.device_problem(text, *facts)
        if problem is not None:
            raise PrecisionRefused(f"model {name!r}: text_encoder_precision {text} cannot run here: {problem}")
        native = self.native(facts[0])
        if precision.lossy(mode, native) or (text is not None and precision.lossy(text, native)):
            self.check_gate(name, facts[0])

    def check_gate(self, name: str, device_type: str | None = None) -> None:
        """Refuse (engine.levers.gates.UngatedSetting) the lossy accelerators or a precision below native on a model
        whose recorded gate did not pass, and a distilled registration (one naming a teacher) whose distilled gate did
        not."""
        info = self.registry.get(name)
        needed = [s for s in (gates.DISTILLED if info.teacher else "", self.gate_setting(name, device_type)) if s]
        if needed and name not in self.measuring and name not in self._gates_passed:
            identity = self.gate_identity(info)
            for setting in needed:
                gates.require(self.config.cache_dir, name, identity, setting)
            self._gates_passed.add(name)

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
        """engine.levers.text_cache.model_identity of the model's `parts`, over its base's too when it has one (a part
        its folder lacks is the base's)."""
        own = model_identity(self.model_path(info), parts)
        return own if info.base is None else f"{own}+{model_identity(info.base, parts)}"

    def gate_identity(self, info: ModelInfo) -> str:
        """What a registration's quality gates are recorded and checked under: engine.levers.content_key.gate_key, the
        SHA-256 of its folder's, base's, adapters' and decoder's files (each file's digest cached beside the gate
        records), with the adapters' scales and the sampler. Once per engine and registration."""
        if info.name not in self._gate_keys:
            digests = content_key.FileDigests(self.config.cache_dir)
            self._gate_keys[info.name] = content_key.gate_key(info, self.model_path(info), digests)
        return self._gate_keys[info.name]

    def get(self, name: str):
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
            self.check_precision(name)
            self.check_gate(name)
            mode = self.precision(name)
            device, dtype = self.config.torch_device(), precision.compute_dtype(mode, self.config.torch_dtype())
            text = self.text_encoder_precision(name)
            text_dtype = None if text is None else precision.compute_dtype(text, self.config.torch_dtype())
            path = self.model_path(info)
            # After the checks above, so a model that cannot load unloads none.
            self._make_room(max(self.config.max_models, 1) - 1)
            if self.before_load is not None:
                self.before_load(name, tuple(self._pipelines))
            log.info("loading model %s from %s on %s (%s, precision %s, text encoder %s)", name, path, device, dtype,
                     mode, text or mode)
            pipe = load_pipeline(info, path, dtype, text_dtype)
            # A registration's adapters fused, its sampler and light decoder (engine.adapters.apply), before compiling.
            self._decoders[name] = adapt.apply(pipe, info, device)
            if info.offload_idle_expert and getattr(pipe, "transformer_2", None) is not None:
                # Both experts stay in CPU memory; the swap brings each to the device for its steps.
                self.swaps[name] = ExpertSwap(pipe, device)
                for component in pipe.components.values():
                    if isinstance(component, torch.nn.Module) and component not in experts(pipe):
                        component.to(device)
            else:
                pipe.to(device)
            if text in precision.EIGHT_BIT:
                # Where its weights are, before it is offloaded (its 8-bit weights are what waits in CPU memory).
                precision.quantize(pipe.text_encoder, text, keep=precision.TEXT_ENCODER_KEEP)
            if self.config.offloads_text_encoder():
                pipe.text_encoder.to("cpu")  # to the device only to encode what the cache lacks (Engine._embeddings)
            pipe.set_progress_bar_config(disable=True)
            if mode in precision.EIGHT_BIT:
                # After the adapters are fused (their deltas land in float weights) and on the device (torchao
                # quantizes where the weights are), before compiling (which traces the quantized matmuls).
                for model in experts(pipe):
                    precision.quantize(model, mode)
            if self.config.fast_vae_norm:
                use_fast_vae_norm(pipe.vae)
            # Every switch on each expert (Wan 2.2 A14B has two transformers).
            if self.config.attention != "native":
                try:
                    for model in experts(pipe):
                        model.set_attention_backend(self.config.attention)
                except (ValueError, RuntimeError, ImportError) as exc:
                    raise RenderError(f"attention backend {self.config.attention!r} cannot run here: {exc}") from None
            layout = parallel.Layout(self.config.ulysses, self.config.cfg_parallel, self.config.ring)
            if layout.ranks > 1:
                for model in experts(pipe):
                    parallel.apply(model, layout)
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
        """A registration's light decoder (engine.adapters.light_decoder), or None where its VAE decodes."""
        self.get(name)
        return self._decoders[name]

    def keep_only(self, names: tuple[str, ...]) -> None:
        """Unload every pipeline but those of `names` (a group's rank, loading what rank 0 loads)."""
        for name in [n for n in self._pipelines if n not in names]:
            self._pipelines.move_to_end(name, last=False)
        self._make_room(sum(n in names for n in self._pipelines))

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
