"""What a bench result was measured on: the code's commit, the packages' versions, the device, and on a known GPU
its datasheet peak (so MFU can be read against both the peak measured in the run and the one sold)."""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

PACKAGES = ("torch", "diffusers", "transformers", "peft", "av")
# Dense (no sparsity) tensor-core peaks in GFLOP/s from NVIDIA's datasheets, for the dtype the engine runs on a GPU
# (bf16; fp16 is the same on these parts), keyed by a substring of torch.cuda.get_device_name(). H100 and H200 SXM:
# 989.4 TFLOPS; H100 PCIe: 756; A100 (SXM and PCIe): 312; L40S: 362.05; L4: 121; A10: 125.
DATASHEET_GFLOPS = (
    ("H200", 989_400.0),
    ("H100 PCIe", 756_000.0),
    ("H100", 989_400.0),
    ("A100", 312_000.0),
    ("L40S", 362_050.0),
    ("L4", 121_000.0),
    ("A10", 125_000.0),
)
REPO = Path(__file__).resolve().parents[2]


def environment(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or
                                                                              platform.machine())
    return {"commit": commit(), "versions": versions(), "device_name": name,
            "threads": torch.get_num_threads(), "datasheet_peak_gflops": datasheet_peak(name, device)}


def datasheet_peak(name: str, device: torch.device) -> float | None:
    """The listed bf16 dense peak of a known GPU; None on a CPU or an unlisted device (first match wins, so the
    more specific names come first)."""
    if device.type != "cuda":
        return None
    return next((peak for key, peak in DATASHEET_GFLOPS if key in name), None)


def commit() -> str:
    """The checkout's commit (with "+dirty" when files differ from it), or "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10,
                              check=False)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out
