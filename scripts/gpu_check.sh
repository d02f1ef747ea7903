#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (H200-class for the numbers in docs/PERFORMANCE.md) and no
# network: the tests that need a GPU, then `reelbatch bench --preset wan-1.3b` with compile off and on.
# Needs the project installed with a CUDA build of torch (PYTHON names that interpreter). Writes into OUT_DIR:
# nvidia-smi.txt, tests.txt, bench-wan-1.3b.json, bench-wan-1.3b-compile.json and the logs.
#   usage: scripts/gpu_check.sh OUT_DIR [STEPS]    (STEPS: denoising steps per video, default 50)
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [STEPS]}
steps=${2:-50}
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export REELBATCH_CACHE_DIR=${REELBATCH_CACHE_DIR:-$out/cache} HF_HUB_OFFLINE=1 REELBATCH_GPU_TESTS=1
status=0

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || status=1
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" \
  > "$out/torch.txt" 2>&1 || { cat "$out/torch.txt"; exit 1; }
"$py" -m pytest tests/gpu -q -p no:cacheprovider > "$out/tests.txt" 2>&1 || status=1
tail -n 3 "$out/tests.txt"
for mode in eager compile; do
  name=bench-wan-1.3b; [ "$mode" = compile ] && name=bench-wan-1.3b-compile
  REELBATCH_COMPILE=$([ "$mode" = compile ] && echo 1 || echo 0) \
    "$py" -m jobs bench --preset wan-1.3b --videos 2 --steps "$steps" --json > "$out/$name.json" 2> "$out/$name.log" \
    || { status=1; tail -n 20 "$out/$name.log"; }
  "$py" -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], 'speedup', round(r['speedup'], 3), 'mfu', round(r['denoise_mfu'], 3), 'baseline mfu', round(r['baseline_denoise_mfu'], 3), 'min psnr', round(r['min_psnr_db'], 1))" "$out/$name.json" || true
done
exit $status
