"""A long video's chunks in the job path (engine.long.chunks plans them, Engine.finish_long joins them): each chunk's
request, its latents checkpointed in the store between chunks, the stitch and decode with the last chunk, and the
checkpoints' removal once the video succeeded. jobs.render.store calls these with the video's store.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import replace

import safetensors.torch
import torch

from engine.engine import Engine
from engine.long.chunks import ChunkPlan, chunk_seed
from engine.types import RenderedVideo, RenderRequest, Shape
from jobs.claims.claims import ClaimedUnit
from jobs.db.queries import Factory
from jobs.manifest.keys import checkpoint_key
from jobs.render.record import checkpoints, chunk_tokens
from storage.stores import Store, StoreError

log = logging.getLogger(__name__)


def chunk_request(factory: Factory, store: Store, request: RenderRequest, unit: ClaimedUnit) -> RenderRequest:
    """A long video's chunk asks for its latents, draws its own noise (engine.long.chunks.chunk_seed), and after the
    first, is tied to the end of the chunk before it (read back from that chunk's checkpoint in the store)."""
    if not unit.chunked:
        return request
    condition = None
    if unit.chunk > 0:
        (previous,) = checkpoints(factory, unit.video_id, unit.chunk)[-1:]
        if previous is None:
            raise RuntimeError(f"video {unit.key}: chunk {unit.chunk - 1} has no checkpoint")
        condition = load_latents(store.get(previous))[:, -unit.chunk_overlap:]
    return replace(request, seed=chunk_seed(request.seed, unit.chunk), condition=condition, latents_only=True)


def save_latents(latents: torch.Tensor) -> bytes:
    return safetensors.torch.save({"latents": latents.contiguous()})


def load_latents(data: bytes) -> torch.Tensor:
    return safetensors.torch.load(data)["latents"]


def store_chunk(store: Store, unit: ClaimedUnit, latents: torch.Tensor) -> str:
    """A chunk before the last: checkpoint its latents in the store; returns the checkpoint's key."""
    data = save_latents(latents)
    key = checkpoint_key(unit.run_name, unit.key, unit.chunk, unit.token)
    store.put(key, data, sha256=hashlib.sha256(data).hexdigest(),
              content_type="application/octet-stream",
              metadata={"run": unit.run_name, "id": unit.key, "chunk": str(unit.chunk)})
    return key


def stitch_long(factory: Factory, store: Store, engine: Engine, shape: Shape, unit: ClaimedUnit,
                video: RenderedVideo) -> RenderedVideo:
    """The last chunk of a long video: its latents after the checkpointed chunks', stitched, decoded, and scored at
    the seams. The earlier chunks' seconds are on the video's row already; these are the last chunk's."""
    earlier = [load_latents(store.get(key)) for key in checkpoints(factory, unit.video_id, unit.chunk)]
    temporal_factor = engine.registry.get(shape.model).temporal_factor
    chunk_plan = ChunkPlan(unit.frames, shape.frames, unit.chunk_overlap, temporal_factor)
    with _DECODING:
        return engine.finish_long(shape.model, [*earlier, video.latents], chunk_plan, video.request, video.stages,
                                  video.noise_kept)


# One stitch's decode at a time in a process, whatever the store's threads (jobs.render.store): each decodes a whole
# long video on the engine's device beside the render in hand, and two at once would hold twice that memory.
_DECODING = threading.Lock()


def drop_checkpoints(factory: Factory, store: Store, unit: ClaimedUnit) -> None:
    """A long video succeeded: its chunk checkpoints are no longer needed, nor those a killed attempt wrote before
    it could record them (every lease token each chunk has had; deleting a missing key does nothing). Best effort:
    a leftover is scratch."""
    for chunk, token in chunk_tokens(factory, unit.video_id).items():
        for attempt in range(1, token + 1):
            key = checkpoint_key(unit.run_name, unit.key, chunk, attempt)
            try:
                store.delete(key)
            except StoreError as exc:
                log.warning("could not remove checkpoint %s: %s", key, exc)
