"""What a quality gate is keyed by: the SHA-256 of the content of every file it covers.

A gate says a lever is safe on particular weights, so its key is those weights' content: it changes when any byte
of them does, and it stays the same for the same files copied elsewhere (another folder, another machine of the
fleet, new modification times), so a record made on one machine serves every worker holding those files. The
covered files: the model folder's parts (ALL_PARTS: model_index.json,
scheduler, text encoder, tokenizer, transformer(s), VAE; not its README or stored references, which measuring
rewrites), its base folder's where it has one, each adapter file, and the light decoder's folder; plus what no
file holds (each adapter's scale and expert, the sampler).

Reading a 14B model's 60 GB takes minutes, so each file's digest is kept in a small JSON file beside the gate
records (HASHES_FILE), against its resolved path, size and modification time: computed once, and again only when
one of those changes (a file rewritten in place with its size and time put back would keep its old digest: the
cache trusts the file system's stamp, as make and rsync do).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from engine.models.registration import HIGH_NOISE
from engine.models.registry import ModelInfo

HASHES_FILE = "quality-gates.hashes.json"
_CHUNK = 1 << 20
# The parts of a diffusers folder a gate covers. Here, not in engine.levers.text_cache (which imports torch), so that
# `reelbatch models` reads gate states without importing torch.
ALL_PARTS = ("model_index.json", "scheduler", "text_encoder", "tokenizer", "transformer", "transformer_2", "vae")


def folder_files(folder: Path, parts: tuple[str, ...] = ALL_PARTS) -> list[Path]:
    """The files of `folder` a gate covers: those of its `parts` (a part is a file or a folder), sorted."""
    files = []
    for part in parts:
        path = folder / part
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file())
    return files


class FileDigests:
    """SHA-256 of files, remembered under `cache_dir` against each file's path, size and modification time."""

    def __init__(self, cache_dir: Path):
        self.path = Path(cache_dir) / HASHES_FILE
        try:
            self._known: dict[str, list] = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):  # a damaged cache is recomputed, never trusted
            self._known = {}
        self.computed = 0  # files read in full by this object (tests count them)

    def sha256(self, path: Path) -> str:
        path = Path(path).resolve()
        stat = path.stat()
        stamp = [stat.st_size, stat.st_mtime_ns]
        known = self._known.get(str(path))
        if known is not None and known[:2] == stamp:
            return known[2]
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(_CHUNK):
                digest.update(block)
        self.computed += 1
        self._known[str(path)] = [*stamp, digest.hexdigest()]
        self._save()
        return digest.hexdigest()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".hashes-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self._known, f, indent=0, sort_keys=True)
        os.replace(tmp, self.path)


def gate_key(info: ModelInfo, folder: Path, digests: FileDigests) -> str:
    """The key a registration's gates are recorded and checked under: a SHA-256 over each covered file's place and
    content digest, in a fixed order, and the adapters' scales and experts and the sampler."""
    key = hashlib.sha256()

    def add(label: str, root: Path, files: list[Path]) -> None:
        for path in files:
            key.update(f"{label}\0{path.relative_to(root).as_posix()}\0{digests.sha256(path)}\0".encode())

    add("folder", folder, folder_files(folder))
    if info.base is not None:
        add("base", info.base, folder_files(info.base))
    for adapter in info.adapters:
        add("adapter", adapter.path.parent, [adapter.path])
        key.update(f"scale\0{adapter.scale!r}\0".encode())
        if adapter.expert != HIGH_NOISE:
            key.update(f"expert\0{adapter.expert}\0".encode())
    if info.sampler is not None:
        key.update(f"sampler\0{info.sampler.key()}\0".encode())
    if info.decoder is not None:
        add("decoder", info.decoder, sorted(p for p in info.decoder.rglob("*") if p.is_file()))
    return key.hexdigest()
