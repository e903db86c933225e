#!/bin/bash
# The cuda backend checked on a machine with a GPU (results: studies/verdicts-on-a-cuda-gpu.md).
#   bash tools/cuda_check.sh OUT_DIR [DUMP_DIR ...]
# Runs studies/cuda_kernels.py, studies/rounded_once.py on the GPU's 16-bit kernels,
# the tests that use a CUDA device, then each DUMP_DIR holding a dump.json and every
# calibration dump of tests/dumps/models with --msprobe-device=cuda, single-run and
# offline; each run's output goes to OUT_DIR.
# A run is cut at BUDGET seconds from the start (default 600): what ran is kept.
set -u
out=${1:?usage: cuda_check.sh OUT_DIR [DUMP_DIR ...]}; shift
mkdir -p "$out"; start=$(date +%s); budget=${BUDGET:-600}
left() { echo $(( budget - ($(date +%s) - start) )); }
run() {  # run NAME COMMAND...: its output to OUT_DIR/NAME.txt, its summary line here
  local name=$1; shift
  if [ "$(left)" -lt 20 ]; then echo "$name: not run (budget)"; return; fi
  timeout "$(left)" "$@" > "$out/$name.txt" 2>&1
  echo "$name: rc $? $(tail -n 1 "$out/$name.txt")"
}
python3 studies/cuda_kernels.py > "$out/cuda_kernels.txt" 2>&1; cat "$out/cuda_kernels.txt"
run rounded_once python3 studies/rounded_once.py --device cuda
run tests python3 -m pytest -p no:cacheprovider -q -n 8 -rfEs tests/models/test_shared_dumps.py tests/run/test_bench_site.py tests/plugin/test_plugin.py tests/judge/offline/test_offline.py tests/judge/verdict/test_groups.py
for dump in "$@" tests/dumps/models/*_tensor_*; do
  for mode in single-run offline; do
    flags=(); [ "$mode" = offline ] && flags=(--msprobe-offline)
    run "$(basename "$dump")_$mode" python3 -m pytest -p no:cacheprovider -q -n 8 -rfE "--msprobe-dump=$dump/dump.json" \
      --msprobe-device=cuda "--msprobe-out=$out/results/$(basename "$dump")_$mode" "${flags[@]}"
  done
done
