"""Hold the CPU math kernels to one instruction set, so that a render's bytes depend on its inputs alone: not on the
CPU's vector width, nor on how many threads the math library chose for a product at that moment.

Measured on the demo (2026-12, torch 2.13.0 CPU, an Intel Xeon with AVX-512): `green-square-down`, a batch of one,
renders other bytes when either of two libraries takes another path.
- MKL's matrix products (torch's CPU build links MKL): its AVX-512 kernels and its AVX2 ones round differently, and
  even when held to AVX2 its result depends on the thread count it uses (1 thread and 2-3 threads gave two different
  MP4s). So a machine without AVX-512 rendered other bytes, and so did a loaded machine whenever MKL ran a product on
  fewer threads. MKL's conditional numerical reproducibility, AVX2 branch in strict mode, gives the same bits on any
  CPU with AVX2 and any thread count (Intel's oneMKL developer guide, "Obtaining Numerically Reproducible Results").
- ATen's own vectorised kernels (torch picks AVX-512 or AVX2 code when it first dispatches) are left alone: held to
  AVX2 (ATEN_CPU_CAPABILITY=avx2), torch's bf16 attention on the CPU fails ("pack_vnni2 is only supported when
  avx512 is supported"), so a bf16 render on a CPU would break. An operator may still set it.
MKL reads its mode when first used, so it is set when the engine is imported, before anything renders. A variable
the operator set already wins: `MKL_CBWR=AUTO` gives MKL its fastest path back, at the cost of bytes that depend on
the machine and its load (docs/SETTINGS.md). On a GPU MKL is not used for the model's math.
"""

from __future__ import annotations

import os

PINS = {"MKL_CBWR": "AVX2,STRICT"}


def pin() -> dict[str, str]:
    """Set each pin the environment does not set already; return the values in force."""
    for name, value in PINS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in PINS}
