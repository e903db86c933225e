#!/usr/bin/env bash
# Run the verdict harnesses on one checkout of pytest-msprobe and keep every result file, so
# that two checkouts' verdicts can be compared (docs/developing/verdict-records.md).
#
#   bash tools/verdict_harnesses.sh WORKTREE OUT [real|kd|kd-full|real-small|kd-small ...]
#
# WORKTREE: a checkout with its own venv (WORKTREE/.venv, plugin installed editable from it).
# OUT: where the records go (e.g. records/before, records/after); made if absent.
# REAL_DUMPS: the folder of real-model dumps for the real parts (made once with
#   tools/make_real_model_dumps.py; judge the same files on both sides).
# Parts (default: real kd):
#   real        studies/real_models.py over $REAL_DUMPS, both modes, -n $REAL_WORKERS (default 2)
#               -> OUT/real/{single,offline}/ (+ OUT/real/RESULTS-real-models.md, harness.log)
#   kd          studies/kernel_diversity.py on every shipped dump (its default set: 25), one
#               path (ATEN_CPU_CAPABILITY=default, 1 thread), both modes: 47 plugin runs
#               -> OUT/kd/runs/ (+ summary.csv/md, events.csv, harness.log)
#   kd-full     the same with caps default avx2 x threads 1 2: 188 runs (about 9 min on an idle
#               machine, 2 h at load 7 on 2 cores)  -> OUT/kd-full/
#   real-small  real_models.py on a copy of one dump (REAL_SMALL, default gpt2_eager_L1_tensor_fp32)
#               in OUT/real-small/dumps -> OUT/real-small/   (for run-to-run repeatability checks)
#   kd-small    kernel_diversity.py on tests/dumps/models/apizoo_tensor_fp32, path default/1t,
#               both modes -> OUT/kd-small/
# Wall times are appended to OUT/times.txt. Compare two OUT folders with
#   WORKTREE/.venv/bin/python WORKTREE/tools/compare_records.py BEFORE AFTER
set -euo pipefail
WT=$(cd "${1:?WORKTREE}" && pwd)
OUT=${2:?OUT}
shift 2
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(real kd)
PY="$WT/.venv/bin/python"
DUMPS=${REAL_DUMPS:-}
case " ${PARTS[*]} " in
  *" real "*|*" real-small "*)
    [ -n "$DUMPS" ] || { echo "set REAL_DUMPS to the folder of real-model dumps (tools/make_real_model_dumps.py)" >&2; exit 2; } ;;
esac
SMALL=${REAL_SMALL:-gpt2_eager_L1_tensor_fp32}
# pytest-xdist workers of real_models.py (its default, 2, as BEFORE ran). Single-run dropout
# draws another mask each run whatever the workers (-n 0 too): compare_records.py compares
# those calls by verdict only (README.md)
WORKERS=${REAL_WORKERS:-2}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
unset PYTEST_ADDOPTS

# the plugin must be imported from WORKTREE, not from another checkout's editable install
where=$(cd /tmp && "$PY" -c 'import pytest_msprobe, os; print(os.path.realpath(pytest_msprobe.__file__))')
case "$where" in
  "$WT"/*) ;;
  *) echo "pytest_msprobe comes from $where, not $WT: run '$PY -m pip install --no-deps -e $WT'" >&2; exit 2 ;;
esac
echo "$(date -u +%FT%TZ) $WT at $(git -C "$WT" log -1 --format='%h %s' | cut -c1-80); git status --porcelain: $(git -C "$WT" status --porcelain | wc -l) lines" >> "$OUT/times.txt"

timed() {  # timed NAME COMMAND...: run from WORKTREE, log to OUT/NAME/harness.log, wall time to times.txt
  local name=$1; shift
  mkdir -p "$OUT/$name"
  local start=$SECONDS
  echo "$(date -u +%FT%TZ) start $name: $*" >> "$OUT/times.txt"
  (cd "$WT" && "$@") > "$OUT/$name/harness.log" 2>&1 || echo "$name: exit $?" >> "$OUT/times.txt"
  echo "$(date -u +%FT%TZ) end $name: wall $((SECONDS - start)) s" >> "$OUT/times.txt"
}

for part in "${PARTS[@]}"; do
  case "$part" in
    real)
      timed real "$PY" studies/real_models.py --dumps "$DUMPS" --scratch "$OUT/real" \
        --markdown "$OUT/real/RESULTS-real-models.md" --modes single offline -n "$WORKERS" ;;
    real-small)
      rm -rf "$OUT/real-small/dumps" && mkdir -p "$OUT/real-small/dumps"
      cp -r "$DUMPS/$SMALL" "$OUT/real-small/dumps/$SMALL"
      timed real-small "$PY" studies/real_models.py --dumps "$OUT/real-small/dumps" --scratch "$OUT/real-small" \
        --markdown "$OUT/real-small/RESULTS-real-models.md" --modes single offline -n "$WORKERS" ;;
    kd)
      timed kd "$PY" studies/kernel_diversity.py --caps default --threads 1 --modes single offline \
        --scratch "$OUT/kd/runs" --csv "$OUT/kd/summary.csv" --markdown "$OUT/kd/summary.md" --events "$OUT/kd/events.csv" ;;
    kd-full)
      timed kd-full "$PY" studies/kernel_diversity.py --caps default avx2 --threads 1 2 --modes single offline \
        --scratch "$OUT/kd-full/runs" --csv "$OUT/kd-full/summary.csv" --markdown "$OUT/kd-full/summary.md" \
        --events "$OUT/kd-full/events.csv" ;;
    kd-small)
      timed kd-small "$PY" studies/kernel_diversity.py --caps default --threads 1 --modes single offline \
        --scratch "$OUT/kd-small/runs" --csv "$OUT/kd-small/summary.csv" --events "$OUT/kd-small/events.csv" \
        tests/dumps/models/apizoo_tensor_fp32 ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
