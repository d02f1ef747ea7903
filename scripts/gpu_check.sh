#!/usr/bin/env bash
# The GPU check, in one call, for a machine with an NVIDIA GPU (H200-class for the numbers in docs/PERFORMANCE.md)
# and no network. In order of value, each step with its own time limit, each writing into OUT_DIR as it goes:
#   1. wheels: if the project's dependencies are missing and .whl/ holds them (cp312 wheels: diffusers, sqlalchemy,
#      alembic, mako, av, croniter, importlib_metadata), install them to /tmp/site;
#   2. nvidia-smi.txt, torch.txt; attention.json: torch's SDPA kernels (flash, cuDNN, memory-efficient) timed at
#      Wan2.1-1.3B's self-attention shape (12 heads x 128, 32760 tokens = 81 frames at 832x480), to pick the engine's
#      attention backend (REELBATCH_ATTENTION) for step 3;
#   3. bench-wan-1.3b.json: `reelbatch bench --preset wan-1.3b` with that backend (the baseline is diffusers' default);
#   4. tests.txt: the tests that need a GPU (tests/gpu);
#   5. bench-wan-1.3b-compile.json: the same bench with compile on too, if time is left;
#   6. envelope-wan-1.3b.json: `reelbatch bench envelope --preset wan-1.3b --no-record` (peak memory at seven sizes
#      around 832x480, 81 frames; the line and its held-out error), if time is left;
#   7. cold-wan-1.3b.json: `reelbatch bench cold` of the 1.3B bench folder registered as `bench-1.3b` (832x480, 4
#      steps; compile off, compile on cold, from the bundle), if time is left and the CLI's packages are installed.
#   8. parallel-wan-1.3b.json: `reelbatch bench parallel --preset wan-1.3b` on the GPUs present (2: Ulysses 2 and CFG
#      parallel 2; 4: also Ulysses 4 and 2 x 2; 8: also 4 x 2, since 1.3B's 12 heads rule out Ulysses 8), if time is
#      left and there are at least 2 GPUs.
#   usage: scripts/gpu_check.sh OUT_DIR [STEPS] [BUDGET_S]
#   (STEPS: denoising steps per video, default 50; BUDGET_S: seconds the whole check may take, default 3600)
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [STEPS] [BUDGET_S]}
steps=${2:-50}
budget=${3:-3600}
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$out"
start=$SECONDS
left() { echo $(( budget - (SECONDS - start) )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 REELBATCH_GPU_TESTS=1
# Models are built into the cache (the 1.3B bench model is 14 GB with its UMT5-XXL encoder): memory if it fits.
if [ -z "${REELBATCH_CACHE_DIR:-}" ]; then
  if [ -d /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -gt 40000000 ]; then
    export REELBATCH_CACHE_DIR=/dev/shm/reelbatch-cache
  else
    export REELBATCH_CACHE_DIR=$out/cache
  fi
fi
status=0

if ! "$py" -c "import diffusers, sqlalchemy, alembic, av, croniter" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  rm -rf /tmp/site
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || status=1
"$py" -c "import torch, diffusers; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, diffusers.__version__, torch.cuda.get_device_name())" \
  > "$out/torch.txt" 2>&1 || { cat "$out/torch.txt"; exit 1; }
cat "$out/torch.txt"

timeout 120 "$py" - "$out/attention.json" <<'EOF' || status=1
import json, sys, time
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn(1, 12, 32760, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
flop = 4 * 32760 * 32760 * 128 * 12
result = {}
for name, backend, diffusers_name in (("flash", SDPBackend.FLASH_ATTENTION, "native"),
                                      ("cudnn", SDPBackend.CUDNN_ATTENTION, "_native_cudnn"),
                                      ("efficient", SDPBackend.EFFICIENT_ATTENTION, "_native_efficient")):
    try:
        with sdpa_kernel(backend):
            for _ in range(2):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(5):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
            torch.cuda.synchronize()
        result[name] = {"tflops": flop * 5 / (time.perf_counter() - t0) / 1e12, "backend": diffusers_name}
    except Exception as exc:  # a kernel this build or GPU lacks
        result[name] = {"error": str(exc)[:200]}
best = max((r for r in result.values() if "tflops" in r), key=lambda r: r["tflops"])
result["best"] = best["backend"]
json.dump(result, open(sys.argv[1], "w"), indent=1)
print(json.dumps(result))
EOF
attention=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['best'])" "$out/attention.json" 2>/dev/null || echo native)

summary() {
  "$py" -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], 'speedup', round(r['speedup'], 3), 'mfu', round(r['denoise_mfu'], 3), 'baseline mfu', round(r['baseline_denoise_mfu'], 3), 'min psnr', round(r['min_psnr_db'], 1), 'peak', round(r['peak_gflops']), 'baseline stages', {k: round(v, 1) for k, v in r['baseline']['stages'].items()}, 'engine stages', {k: round(v, 1) for k, v in r['engine']['stages'].items()})" "$1" || true
}

bench() {  # name, time limit, env assignments...
  local name=$1 limit=$2; shift 2
  echo "== $name: $* (limit ${limit}s, $(left)s left)"
  # `reelbatch bench --preset wan-1.3b --videos 2 --steps $steps --json`, called as the CLI calls it (the CLI's
  # typer need not be installed on the GPU machine).
  env "$@" timeout "$limit" "$py" -c "import dataclasses, json, sys
from jobs.bench.compare import PRESETS, run_bench
from jobs.settings import Settings
preset = dataclasses.replace(PRESETS['wan-1.3b'], steps=int(sys.argv[1]))
print(json.dumps(run_bench(preset, Settings.from_env(), videos=2).to_dict()))" "$steps" \
    > "$out/$name.json" 2> "$out/$name.log" || { status=1; tail -n 25 "$out/$name.log"; return; }
  summary "$out/$name.json"
}

bench bench-wan-1.3b $(( $(left) - 100 )) REELBATCH_COMPILE=0 REELBATCH_ATTENTION="$attention"
echo "== tests ($(left)s left)"
timeout $(( $(left) > 135 ? 120 : $(left) - 15 )) "$py" -m pytest tests/gpu -q -p no:cacheprovider \
  > "$out/tests.txt" 2>&1 || status=1
tail -n 5 "$out/tests.txt"
if [ "$(left)" -gt 250 ]; then
  bench bench-wan-1.3b-compile $(( $(left) - 10 )) REELBATCH_COMPILE=1 REELBATCH_ATTENTION="$attention"
else
  echo "== compile bench skipped: $(left)s left"
fi
if [ "$(left)" -gt 200 ]; then
  echo "== envelope ($(left)s left)"
  timeout $(( $(left) - 10 )) "$py" -c "import json
from jobs.bench.envelope import model_info, run_envelope
from jobs.settings import Settings
settings = Settings.from_env()
print(json.dumps(run_envelope(settings, model_info(settings, None, 'wan-1.3b'), record=False).to_dict()))" \
    > "$out/envelope-wan-1.3b.json" 2> "$out/envelope-wan-1.3b.log" || { status=1; tail -n 25 "$out/envelope-wan-1.3b.log"; }
else
  echo "== envelope skipped: $(left)s left"
fi
folder="$REELBATCH_CACHE_DIR/models/bench-wan-1.3b-v1"
if [ "$(left)" -gt 400 ] && [ -d "$folder" ] && "$py" -c "import typer, celery" 2>/dev/null; then
  echo "== cold ($(left)s left)"
  printf 'bench-1.3b:\n  path: %s\n  max_frames: 81\n  defaults: {width: 832, height: 480, fps: 16, duration_s: 5, steps: 4, guidance: 5.0}\n' \
    "$folder" > "$out/models.yaml"
  REELBATCH_MODELS="$out/models.yaml" timeout $(( $(left) - 10 )) "$py" -m jobs bench cold --model bench-1.3b \
    --resolution 832x480 --steps 4 --json > "$out/cold-wan-1.3b.json" 2> "$out/cold-wan-1.3b.log" \
    || { status=1; tail -n 25 "$out/cold-wan-1.3b.log"; }
else
  echo "== cold skipped: $(left)s left, folder $( [ -d "$folder" ] && echo built || echo missing)"
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
layouts=""
[ "$gpus" -ge 2 ] && layouts="2,1x2"
[ "$gpus" -ge 4 ] && layouts="$layouts,4,2x2"
[ "$gpus" -ge 8 ] && layouts="$layouts,4x2"
if [ -n "$layouts" ] && [ "$(left)" -gt 300 ] && "$py" -c "import typer, celery" 2>/dev/null; then
  echo "== parallel on $gpus GPUs: $layouts ($(left)s left)"
  timeout $(( $(left) - 10 )) "$py" -m jobs bench parallel --preset wan-1.3b --ranks "$layouts" --videos 2 \
    --steps "$steps" --json > "$out/parallel-wan-1.3b.json" 2> "$out/parallel-wan-1.3b.log" \
    || { status=1; tail -n 25 "$out/parallel-wan-1.3b.log"; }
else
  echo "== parallel skipped: $gpus GPUs, $(left)s left"
fi
echo "done in $(( SECONDS - start ))s"
exit $status
