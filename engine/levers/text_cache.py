"""Text-embedding cache: a prompt is encoded once per model, then read from memory or disk.

Nightly manifests repeat prompts (ad variants share a negative prompt; data sets reuse templates), and the text
encoder of a real model (UMT5-XXL for Wan) is a large share of a short clip's work. An entry is keyed by the model's
text-encoder identity (its files' names, sizes and modification times, and its config), the encoder's dtype, the
maximum sequence length and the text, so a changed model, dtype or length never reads an old entry.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

TEXT_PARTS = ("text_encoder", "tokenizer")


def model_identity(folder: Path, parts: tuple[str, ...] = TEXT_PARTS) -> str:
    """A digest of everything that decides what `parts` of a model compute (by default, what the text encoder
    returns): their files' names, sizes and mtimes (weights are not read, so this is cheap even for a 10 GB encoder)
    and their config and tokenizer files' contents."""
    digest = hashlib.sha256()
    for part in parts:
        if (folder / part).is_file():
            digest.update(f"{part}\0".encode() + (folder / part).read_bytes())
            continue
        for path in sorted((folder / part).rglob("*")) if (folder / part).is_dir() else []:
            if not path.is_file():
                continue
            stat = path.stat()
            digest.update(f"{path.relative_to(folder)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
            if path.suffix in (".json", ".txt", ".model"):
                digest.update(path.read_bytes())
    return digest.hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class TextEmbeddingCache:
    """An LRU of CPU tensors in memory, over optional safetensors files on disk (shared by the workers of a machine).

    Each entry is one text's embedding, (max_sequence_length, dim), exactly as the pipeline's encode_prompt returns
    it, so a cached render is bit-identical to an uncached one.
    """

    def __init__(self, folder: Path | None, capacity: int = 4096):
        self.folder = folder
        self.capacity = capacity
        self._memory: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.stats = CacheStats()

    @staticmethod
    def key(model: str, dtype: torch.dtype, max_sequence_length: int, text: str) -> str:
        return hashlib.sha256(f"{model}\0{dtype}\0{max_sequence_length}\0{text}".encode()).hexdigest()

    def embeddings(self, model: str, dtype: torch.dtype, max_sequence_length: int, texts: list[str],
                   encode: Callable[[list[str]], torch.Tensor]) -> torch.Tensor:
        """(len(texts), L, D) on the CPU; `encode` is called once, for the distinct texts not cached."""
        keys = [self.key(model, dtype, max_sequence_length, t) for t in texts]
        found = {k: v for k in set(keys) if (v := self._get(k)) is not None}
        missing = dict((k, t) for t, k in zip(texts, keys) if k not in found)  # key -> text, in first-seen order
        self.stats.misses += sum(k in missing for k in keys)
        self.stats.hits += len(keys) - sum(k in missing for k in keys)
        if missing:
            encoded = encode(list(missing.values())).detach().to("cpu")
            for key, row in zip(missing, encoded):
                found[key] = row.clone()
                self._put(key, found[key])
        return torch.stack([found[k] for k in keys])

    def _get(self, key: str) -> torch.Tensor | None:
        if key in self._memory:
            self._memory.move_to_end(key)
            return self._memory[key]
        path = self._path(key)
        if path is None or not path.is_file():
            return None
        try:
            tensor = load_file(path)["embedding"]
        except Exception:  # a truncated or foreign file is a miss, and is rewritten
            return None
        self._remember(key, tensor)
        return tensor

    def _put(self, key: str, tensor: torch.Tensor) -> None:
        self._remember(key, tensor)
        path = self._path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written to a private name and renamed into place: a reader never sees half a file, and two workers
        # writing the same entry both write the same bytes.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".safetensors")
        os.close(fd)
        try:
            save_file({"embedding": tensor.contiguous()}, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _remember(self, key: str, tensor: torch.Tensor) -> None:
        self._memory[key] = tensor
        self._memory.move_to_end(key)
        while len(self._memory) > self.capacity:
            self._memory.popitem(last=False)

    def _path(self, key: str) -> Path | None:
        return None if self.folder is None else self.folder / key[:2] / f"{key}.safetensors"
