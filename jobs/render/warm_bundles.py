"""Warm starts: the compiled code of a shape, kept in a store, so a new worker skips most of its compile.

With compile on, a worker's first ticket compiles the shapes waiting in the queue (jobs.render.serving.warm_up), and
Inductor keeps what it built under TORCHINDUCTOR_CACHE_DIR: a restarted worker on the same machine finds it there,
a new machine compiles again (on a CPU 15-25 s per shape, minutes for a large model on a GPU). With
REELBATCH_WARM_URI set (a folder or a bucket every worker reads), a worker packs that folder after it compiles a
shape and puts it at a key made of everything that makes the code valid for another worker: the model's
registration, the engine's settings, the shape, torch, diffusers and Python, and the device (a GPU's name and
compute capability; a CPU's architecture and the vector ISA torch uses on it). A worker that meets a shape
unpacks its bundle, when there is one, before compiling it.

Why the folder and not torch.compiler.save_cache_artifacts: on this CPU the portable artifacts still left most of the
compile (a first render of 59 s against 91 s cold), the folder almost all of it (11 s; docs/PERFORMANCE.md).
A bundle is code the worker runs: point REELBATCH_WARM_URI only at a store the fleet's operators alone write.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import os
import platform
import tarfile
from pathlib import Path

from engine.engine import Engine
from engine.types import Shape
from storage.base import StoreError, sha256_hex
from storage.stores import open_store

log = logging.getLogger(__name__)

# A bundle larger than this is not fetched (a folder that grew with many shapes: the worker compiles instead).
MAX_BUNDLE_BYTES = 512 << 20


def device_identity(device) -> str:
    """What the code compiled for this device runs on: a GPU's name and compute capability, or a CPU's
    architecture and the vector ISA torch's kernels use on it."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index or 0
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda {torch.cuda.get_device_name(index)} sm{major}{minor} cuda{torch.version.cuda}"
    return f"cpu {platform.machine()} {torch.backends.cpu.get_cpu_capability()}"


def bundle_key(engine: Engine, shape: Shape) -> str:
    """The store key of `shape`'s bundle for this engine: its model's name and a digest of what makes the code
    valid."""
    import diffusers
    import torch

    config = {k: v for k, v in dataclasses.asdict(engine.config).items() if k != "cache_dir"}
    valid = "\n".join([repr(engine.registry.get(shape.model)), repr(sorted(config.items())), shape.key(),
                       torch.__version__, diffusers.__version__, platform.python_version(),
                       device_identity(engine.config.torch_device())])
    return f"{shape.model}/{hashlib.sha256(valid.encode()).hexdigest()[:32]}.tar"


def inductor_dir() -> Path | None:
    """The folder Inductor caches in, once the engine has set it (engine.models.pipelines, when compile is on)."""
    where = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(where) if where else None


def fetch(uri: str, key: str, into: Path) -> bool:
    """Unpack the bundle at `key` into `into`; False when there is none or it cannot be read (the worker then
    compiles as without one)."""
    store = open_store(uri)
    try:
        if not store.exists(key):
            return False
        data = store.get(key, max_bytes=MAX_BUNDLE_BYTES)
    except StoreError as exc:
        log.warning("warm-start bundle %s not fetched: %s", store.uri_for(key), exc)
        return False
    into.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(into, filter="data")  # no absolute paths, no '..', no links out, no devices
    except (tarfile.TarError, OSError) as exc:
        log.warning("warm-start bundle %s not unpacked: %s", store.uri_for(key), exc)
        return False
    log.info("warm start: unpacked %s (%d bytes) into %s", store.uri_for(key), len(data), into)
    return True


def pack(folder: Path) -> bytes:
    """`folder` as an uncompressed tar (its compiled libraries barely compress), its lock files left out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if relative.parts[0] == "locks" or path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue
            tar.add(path, arcname=str(relative), recursive=False)
    return buffer.getvalue()


def publish(uri: str, key: str, folder: Path) -> bool:
    """Put `folder`, packed, at `key`, unless a bundle is there already (another worker's, as good). True when
    this one was stored."""
    store = open_store(uri)
    try:
        if store.exists(key):
            return False
        data = pack(folder)
        store.put(key, data, sha256=sha256_hex(data), content_type="application/x-tar", metadata={})
    except StoreError as exc:  # two workers publishing at once: the first one's stays
        log.warning("warm-start bundle %s not stored: %s", store.uri_for(key), exc)
        return False
    log.info("warm start: stored %s (%d bytes)", store.uri_for(key), len(data))
    return True
