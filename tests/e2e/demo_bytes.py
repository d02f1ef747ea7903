"""What decides the demo's bytes on a machine: its kind (CPU and the kernels the math libraries pick there), and the
bytes measured on each kind known."""

import subprocess
import sys

# The demo's SHA-256 prefixes on the kinds of machine they were measured on. A render's bytes follow the code paths
# the math libraries pick from the CPU they find: oneDNN's convolution kernels (by instruction set, and by the cache
# sizes it blocks its loops for), ATen's vectorised kernels (AVX-512 or AVX2) and MKL's products (held to one path,
# engine/levers/cpu_math.py). So a machine is known by its CPU's vendor, the kernel oneDNN runs the model's fp32
# convolutions with, its AVX-512, AVX-512 BF16 and AMX flags and its L2 cache; any other machine is compared with
# itself only (test_run's thread test renders again there and must give the same bytes). Measured with torch 2.13.0:
# - 2026-12-05, an Intel Xeon with AVX-512 and AMX: 9289971ba074, e9f63e1d66e5, a4c081f42fc2, ad6b753c8ddc (in the
#   order below; held to oneDNN's AVX2 code the green square gave aea2caaa60dd); 2026-12-07, an AMD EPYC without
#   AVX-512: the same four;
# - 2026-12-07, CI's machine (oneDNN's `jit:avx512_core`): f8fd30f8cad7, 9296aa6a9ee7, 1f1294f73ce3, e3a1a4275f15 (on
#   one thread and three; d4a48782ab50 held to AVX2): the earlier key, kernel and AVX-512 alone, took it for the
#   Intel one, which is why the key now holds more;
# - 2026-12-07, an AMD EPYC with AVX-512 and AVX-512 BF16, 1 MiB of L2 (the row below): CI's first three, and the
#   green square's bytes are the same with oneDNN's AVX2 code.
AMD_EPYC_AVX512 = ("AuthenticAMD", "jit:avx512_core", "avx512", "avx512_bf16", "no amx", "L2 1024K")
DEMO_SHA256 = {
    AMD_EPYC_AVX512:
        {"red-circle-left": "f8fd30f8cad7", "blue-square-up": "9296aa6a9ee7",
         "yellow-circle-right": "1f1294f73ce3", "green-square-down": "d4a48782ab50"},
}
# What the green square renders held to oneDNN's AVX2 code on those machines.
DEMO_GREEN_AVX2 = {AMD_EPYC_AVX512: "d4a48782ab50"}


def cpu_flags() -> tuple[str, set[str]]:
    """This CPU's vendor and flags, as Linux lists them."""
    vendor, flags = "", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return vendor, flags


def cpu_has_avx512() -> bool:
    """Whether this CPU offers AVX-512 (its `avx512f` flag)."""
    return "avx512f" in cpu_flags()[1]


def machine_kind(env: dict) -> tuple[str, ...]:
    """What decides the demo's bytes on this machine (see DEMO_SHA256)."""
    vendor, flags = cpu_flags()
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index2/size") as f:
            l2 = f.read().strip()
    except OSError:
        l2 = "unknown"
    return (vendor, conv_kernel(env), "avx512" if "avx512f" in flags else "no avx512",
            "avx512_bf16" if "avx512_bf16" in flags else "no avx512_bf16",
            "amx" if "amx_tile" in flags else "no amx", f"L2 {l2}")


# One of the toy model's own convolutions (32 to 16 channels, 3x3, a 32x32 frame), run with oneDNN's log on: the log
# names the kernel it ran (`jit:avx512_core`, `jit:avx2`, ...).
CONV_PROBE = """
import torch
with torch.no_grad():
    torch.nn.Conv2d(32, 16, 3, padding=1)(torch.zeros(1, 32, 32, 32))
"""


def conv_kernel(env: dict) -> str:
    """The oneDNN kernel a fp32 convolution runs on this machine under `env`, as its log names it."""
    proc = subprocess.run([sys.executable, "-c", CONV_PROBE], env={**env, "ONEDNN_VERBOSE": "1"}, text=True,
                          capture_output=True, check=True, timeout=120)
    (fields,) = [line.split(",") for line in proc.stdout.splitlines() if ",exec,cpu,convolution," in line]
    return fields[fields.index("convolution") + 1]
