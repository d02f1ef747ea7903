"""A model's memory envelope on one device: peak memory per batch measured across frames x resolution x batch, a
line fitted through it, and from that the largest batch of each shape that keeps SPARE of the device's memory free.

The line is what vLLM's start-up profile and the seeds assume, a peak roughly linear in the work: a fixed part, a
part per latent token in the batch (the transformer's activations: frames x height x width over the VAE's factors
and the patch) and a part per pixel of one frame in the batch (Wan's VAE decodes frame by frame, so its activations
grow with the batch's frame area, not its length):

    peak = fixed + per_token x batch x tokens + per_pixel x batch x width x height

fitted by least squares over the measured points, then raised by its largest shortfall on them so it never predicts
less than was measured there. A batch fits when what the process holds once the model is loaded (`resident`) plus
that peak stays within (1 - SPARE) of the device's memory. An out-of-memory error that still happens raises the
line (`shrunk`) so the batch that failed no longer fits.

Peak memory: on CUDA torch's own peak allocation; on a CPU the process's peak resident set (Linux's VmHWM, reset
through /proc/self/clear_refs before each measurement), in a process whose allocator returns large blocks at once
(jobs.bench.envelope measures in a child with glibc's mmap threshold fixed; freed memory kept by malloc would
otherwise hide part of the next peak).
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
from dataclasses import asdict, dataclass, replace
from pathlib import Path

# The share of the device's memory a batch must leave free (the seeds: at least 20%).
SPARE = 0.2
# No batch above this is planned, whatever the envelope allows.
MOST_BATCH = 64


def tokens(rules, width: int, height: int, frames: int) -> int:
    """Latent tokens of one video of a pass of `frames` frames (engine.models.shape_rules.ShapeRules `rules`)."""
    latents = (frames - 1) // rules.vae_temporal + 1
    cell_h, cell_w = rules.vae_spatial * rules.patch[1], rules.vae_spatial * rules.patch[2]
    return max(1, latents // rules.patch[0]) * (height // cell_h) * (width // cell_w)


@dataclass(frozen=True)
class Point:
    """One measurement: a batch of `batch` videos of one shape, and the peak above what was held before it."""

    width: int
    height: int
    frames: int
    batch: int
    tokens: int  # per video
    peak_bytes: int

    @property
    def work(self) -> tuple[float, float]:
        """(tokens, frame pixels) in the whole batch: the line's two variables."""
        return float(self.batch * self.tokens), float(self.batch * self.width * self.height)


@dataclass(frozen=True)
class Envelope:
    model: str
    device: str  # device_identity(): its name and memory
    memory_bytes: int
    resident_bytes: int  # held once the model is loaded, before a batch
    fixed_bytes: float
    per_token_bytes: float
    per_pixel_bytes: float
    spare: float = SPARE
    ooms: int = 0  # out-of-memory errors that shrank it
    last_oom: str | None = None  # the shape key and batch of the last

    @property
    def budget_bytes(self) -> float:
        """What a batch's peak may take: (1 - spare) of the memory, less what is resident."""
        return self.memory_bytes * (1 - self.spare) - self.resident_bytes

    def each_bytes(self, tokens: int, width: int, height: int) -> float:
        """What one video of a shape adds to a batch's peak."""
        return self.per_token_bytes * tokens + self.per_pixel_bytes * width * height

    def predict(self, batch: int, tokens: int, width: int, height: int) -> float:
        return self.fixed_bytes + batch * self.each_bytes(tokens, width, height)

    def largest_batch(self, tokens: int, width: int, height: int) -> int:
        """The most videos of this shape one batch may hold (0: not even one fits), at most MOST_BATCH."""
        each, room = self.each_bytes(tokens, width, height), self.budget_bytes - self.fixed_bytes
        if room < each:
            return 0
        return MOST_BATCH if each <= 0 else min(MOST_BATCH, int(room // each))

    def shrunk(self, batch: int, tokens: int, width: int, height: int, what: str) -> Envelope:
        """After `batch` videos of a shape ran out of memory: the per-token and per-pixel parts raised in proportion
        so that `batch` of it no longer fits, and the error counted."""
        each, room = self.each_bytes(tokens, width, height), self.budget_bytes - self.fixed_bytes
        scale = 1.0
        if each > 0 and batch * each <= room:
            scale = room / (batch * each) * 1.0001  # just over: batch - 1 may fit, batch does not
        return replace(self, per_token_bytes=self.per_token_bytes * scale, per_pixel_bytes=self.per_pixel_bytes * scale,
                       ooms=self.ooms + 1, last_oom=f"{batch} x {what}")

    def to_dict(self) -> dict:
        return {**asdict(self), "budget_bytes": self.budget_bytes}


def fit(points: list[Point]) -> tuple[float, float, float]:
    """(fixed, per_token, per_pixel) of the line through `points`: least squares with no part below zero (a part
    that comes out negative is left out and the rest fitted again), then the fixed part raised by the line's largest
    shortfall, so it is at or above every point."""
    import numpy as np

    if not points:
        raise ValueError("no points to fit")
    columns = [0, 1, 2]  # fixed, per token, per pixel
    y = np.array([p.peak_bytes for p in points], dtype=np.float64)
    full = np.array([[1.0, *p.work] for p in points], dtype=np.float64)
    while True:
        coef, *_ = np.linalg.lstsq(full[:, columns], y, rcond=None)
        negative = [c for c, v in zip(columns, coef, strict=True) if v < 0 and c != 0]
        if not negative:
            break
        columns.remove(negative[0])
    parts = [0.0, 0.0, 0.0]
    for c, v in zip(columns, coef, strict=True):
        parts[c] = float(v)
    shortfall = max(float(y_i - (full[i] @ np.array(parts))) for i, y_i in enumerate(y))
    parts[0] += max(0.0, shortfall)
    return parts[0], parts[1], parts[2]


def device_identity(device, memory_gib: float | None = None) -> tuple[str, int]:
    """(name, memory in bytes) of a torch `device`: a CUDA device's name and total memory; a CPU's model and the
    memory the process may use (the machine's, or its cgroup's limit when lower). `memory_gib` replaces the memory
    (a worker given part of a machine). The name carries the memory, so a device capped lower is a device apart."""
    import torch

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory = props.name, int(props.total_memory)
    else:
        name, memory = _cpu_name(), _cpu_memory()
    if memory_gib is not None:
        memory = int(memory_gib * 2**30)
    return f"{device.type}: {name}, {memory / 2**30:.1f} GiB", memory


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cpu_memory() -> int:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(limit).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            memory = min(memory, int(raw))
    return memory


class PeakMeter:
    """Peak memory above where it stood when the block began: torch's peak allocation on CUDA; on a CPU the
    resident set's high-water mark, reset at the start (Linux: `5` to /proc/self/clear_refs), with free memory
    first given back to the system (malloc_trim) so the start is what is live."""

    def __init__(self, device):
        self.device, self.peak_bytes, self.start_bytes = device, 0, 0

    def __enter__(self) -> PeakMeter:
        gc.collect()
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
            return self
        _trim()
        try:
            self.start_bytes = resident_bytes()
            Path("/proc/self/clear_refs").write_text("5")
        except OSError as exc:
            raise RuntimeError(f"a CPU's peak memory is read from Linux's /proc/self/status and clear_refs: {exc}") \
                from exc
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self.start_bytes
            return
        self.peak_bytes = max(0, _status("VmHWM") - self.start_bytes)


def resident_bytes(device=None) -> int:
    """What this process holds now: on CUDA torch's allocation on the device, else the resident set."""
    if device is not None and device.type == "cuda":
        import torch

        return int(torch.cuda.memory_allocated(device))
    return _status("VmRSS")


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {key}")


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to give back this way
        pass
