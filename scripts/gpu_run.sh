#!/usr/bin/env bash
# One GPU validation run, start to finish, for the device machine (docs/GPU_RUN.md).
#
#   scripts/gpu_run.sh OUT_DIR [MATRIX] [TIMEOUT]     # defaults: gpu-quick, 420 s for everything
#   scripts/gpu_run.sh --dry-run [OUT_DIR]            # DEVICE=cpu MATRIX=ci LIMIT=3 RESUME=0,
#                                                     # WORK=gpu-out/dry-run, tiny timings
#   DEVICE=cpu MATRIX=ci LIMIT=3 scripts/gpu_run.sh /tmp/out
#
# Steps, each under `timeout` inside one overall deadline (TIMEOUT seconds), so it never hangs:
#   1. install the carried wheels (gpu-wheels/, scripts/fetch_gpu_wheels.sh) into $WORK/site with
#      pip --no-index --no-deps --target, and put it on PYTHONPATH. Not a venv: the image's python3
#      is itself a venv (/opt/torch/.venv) and `venv --system-site-packages` would see the base
#      interpreter's packages, not its torch. Wheels for another Python are skipped (dry runs).
#   2. nvidia-smi, then scripts/gpu_env.py: versions, import checks, CUDA context and cuBLAS
#      workspace probes -> OUT/env.json. If only the carried transformers fails to import, it is
#      set aside and the image's transformers is used (the log says so).
#   3. python -m validate run --matrix MATRIX --device DEVICE --out $WORK/MATRIX.jsonl; a
#      background copy puts the rows into OUT every 10 s, so a run killed from outside still
#      returns what it measured. $WORK (default gpu-out/, git-ignored) stays on a warm machine:
#      a second call resumes where the first stopped (RESUME=0 starts afresh).
#   4. scripts/gpu_throughput.py: step times, fp32 vs bf16-amp, none vs per-layer -> OUT/throughput.json
#   5. scripts/gpu_summary.py: OUT/summary.json, OUT/MATRIX.md if the validator did not write it,
#      and a short table printed last; with DEVICE=cuda each row also wrote a memory snapshot with
#      history ($WORK/snapshots, validate --cuda-snapshots), which the summary replays through the
#      allocator replica beside max_memory_reserved, and OUT/snapshots.tar carries them (up to 15 MiB).
# OUT gets at most 7 files: gpu_run.log env.json MATRIX.jsonl MATRIX.md throughput.json summary.json
# snapshots.tar
#
# Environment: DEVICE (cuda|cpu), LIMIT, ONLY (regex), STEPS (3), TOLERANCE (cuda 3, cpu 1),
# WHEELS (gpu-wheels; 'none' skips), WORK (gpu-out), PYTHON (python3; .venv/bin/python for cpu),
# RESUME (1), VALIDATE_S, THROUGHPUT_S (cuda 75, cpu 60; 0 skips), THROUGHPUT_ARGS (extra args),
# SNAPSHOTS (1; 0 records no memory snapshots).
# Exit status: the validator's (0 all within tolerance, 1 some outside, 124 cut at its deadline),
# 4 when memcalc/validate cannot import, 2 on bad arguments.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = "--dry-run" ]; then
  shift
  export DEVICE=${DEVICE:-cpu} LIMIT=${LIMIT:-3} MATRIX=${MATRIX:-ci} RESUME=${RESUME:-0} \
    WORK=${WORK:-$REPO/gpu-out/dry-run}
  set -- "${1:-$REPO/gpu-out/dry-run/out}" "${2:-$MATRIX}" "${3:-240}"
fi
if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n 2,34p "$0"
  exit 2
fi

mkdir -p "$1" || { echo "gpu_run: cannot create $1" >&2; exit 2; }
OUT=$(cd "$1" && pwd)
MATRIX=${2:-${MATRIX:-gpu-quick}}
TIMEOUT=${3:-${TIMEOUT:-420}}
case "$TIMEOUT" in ''|*[!0-9]*) echo "gpu_run: TIMEOUT must be whole seconds, got '$TIMEOUT'" >&2; exit 2 ;; esac

# Everything this script prints also goes to OUT/gpu_run.log.
# On INT/TERM/HUP to the whole process group the inner script finishes (kills its child, writes
# the summary); tee ignores those signals and ends when the inner script closes the pipe, and this
# outer shell only waits for both (a trap, not an ignore, so the inner script can set its own).
if [ -z "${_GPU_RUN_LOGGED:-}" ]; then
  export _GPU_RUN_LOGGED=1
  trap 'true' INT TERM HUP
  bash "$0" "$OUT" "$MATRIX" "$TIMEOUT" 2>&1 | ( trap '' INT TERM HUP PIPE; exec tee -a "$OUT/gpu_run.log" )
  exit "${PIPESTATUS[0]}"
fi
trap '' PIPE  # never die on a closed output pipe: finishing the run matters more than printing

cd "$REPO" || exit 2
START=$(date +%s)
DEADLINE=$((START + TIMEOUT))
DEVICE=${DEVICE:-cuda}
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_run: DEVICE must be cuda or cpu, got '$DEVICE'"; exit 2 ;; esac
WORK=${WORK:-gpu-out}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
SITE=$WORK/site
WHEELS=${WHEELS:-gpu-wheels}
STEPS=${STEPS:-3}
if [ "$DEVICE" = cuda ]; then TOL=${TOLERANCE:-3}; TP_S=${THROUGHPUT_S:-75}; else TOL=${TOLERANCE:-1}; TP_S=${THROUGHPUT_S:-60}; fi
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ "$DEVICE" = cpu ] && [ -x .venv/bin/python ]; then PY=$REPO/.venv/bin/python
else PY=python3; fi
RESULTS=$WORK/$MATRIX.jsonl
SNAPS=$WORK/snapshots
VALIDATE_RC=""
CHILD=""
SYNCER=""
FINALIZED=""

export PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1 TQDM_DISABLE=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export PYTHONPATH=$REPO
# The engine models torch's defaults: no allocator or cuBLAS workspace settings.
echo "gpu_run: PYTORCH_CUDA_ALLOC_CONF='${PYTORCH_CUDA_ALLOC_CONF:-}' CUBLAS_WORKSPACE_CONFIG='${CUBLAS_WORKSPACE_CONFIG:-}' (both unset for the run)"
unset PYTORCH_CUDA_ALLOC_CONF CUBLAS_WORKSPACE_CONFIG

left() { echo $((DEADLINE - $(date +%s))); }
stamp() { echo "[gpu_run +$(( $(date +%s) - START ))s] $*"; }

# Run "$@" under timeout (seconds in $1) in the background, so that a signal reaches the trap now.
timed() {
  local limit=$1; shift
  if [ "$limit" -lt 1 ]; then stamp "no time left for: $*"; return 124; fi
  timeout -k 10 "$limit" "$@" &
  CHILD=$!
  wait "$CHILD"
  local rc=$?
  CHILD=""
  return $rc
}

sync_results() {
  [ -f "$RESULTS" ] && cp -f "$RESULTS" "$OUT/$MATRIX.jsonl" 2>/dev/null
  return 0
}

start_syncer() {
  (
    n=0
    while sleep 10; do
      sync_results
      n=$((n + 1))
      if [ $((n % 3)) = 0 ] && [ -f "$RESULTS" ]; then
        row=$(tail -n 1 "$RESULTS")
        # keys are sorted: the first label and error_pct are the row's own (model, phases come later)
        last="$(echo "$row" | grep -o '"label": "[^:"]*' | head -1) $(echo "$row" | grep -o '"status": "[^"]*"' | head -1) $(echo "$row" | grep -o '"error_pct": [-0-9.enul]*' | head -1)"
        stamp "progress: $(grep -c . "$RESULTS") rows in $MATRIX.jsonl; last: $(echo "$last" | tr -d '"')"
      fi
    done
  ) &
  SYNCER=$!
}

finalize() {
  [ -n "$FINALIZED" ] && return
  FINALIZED=1
  [ -n "$SYNCER" ] && kill "$SYNCER" 2>/dev/null && wait "$SYNCER" 2>/dev/null
  sync_results
  local md=$WORK/$MATRIX.md
  if [ -f "$md" ] && [ -f "$RESULTS" ] && [ "$md" -nt "$RESULTS" ]; then
    cp -f "$md" "$OUT/$MATRIX.md"
  else
    rm -f "$OUT/$MATRIX.md"  # stale or missing: gpu_summary writes it from the rows
  fi
  stamp "validate exit status: ${VALIDATE_RC:-not run}; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
  local tp=() snaps=()
  [ -f "$OUT/throughput.json" ] && tp=(--throughput "$OUT/throughput.json")
  if ls "$SNAPS"/*.pickle.gz >/dev/null 2>&1; then
    snaps=(--snapshots "$SNAPS")
    # one file for all rows' snapshots (the tool returns 8 files): the smallest first, up to 15 MiB
    local total=0 size f
    : > "$WORK/snapshots.list"
    for f in $(cd "$SNAPS" && ls -S -r -- *.pickle.gz); do
      size=$(stat -c %s "$SNAPS/$f")
      [ $((total + size)) -le $((15 * 1024 * 1024)) ] || continue
      total=$((total + size))
      echo "$f" >> "$WORK/snapshots.list"
    done
    tar -C "$SNAPS" -cf "$OUT/snapshots.tar" -T "$WORK/snapshots.list" || echo "gpu_run: could not bundle the snapshots"
    stamp "snapshots: $(ls "$SNAPS"/*.pickle.gz | wc -l) in $SNAPS, $(wc -l < "$WORK/snapshots.list" 2>/dev/null || echo 0) in snapshots.tar"
  fi
  timeout -k 5 120 "$PY" scripts/gpu_summary.py "$OUT/$MATRIX.jsonl" "${tp[@]}" "${snaps[@]}" --tolerance "$TOL" \
    --json "$OUT/summary.json" --md "$OUT/$MATRIX.md" --title "$MATRIX ($DEVICE)" \
    || echo "gpu_run: gpu_summary failed (status $?)"
}

on_signal() {
  stamp "interrupted by signal: finishing with what was measured"
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null && wait "$CHILD" 2>/dev/null
  VALIDATE_RC=${VALIDATE_RC:-130}
  finalize
  exit 130
}
trap on_signal INT TERM HUP
trap finalize EXIT

stamp "OUT=$OUT MATRIX=$MATRIX DEVICE=$DEVICE TIMEOUT=${TIMEOUT}s LIMIT=${LIMIT:-} ONLY=${ONLY:-} TOLERANCE=$TOL WORK=$WORK PY=$PY"
stamp "git: $(git -C "$REPO" log -1 --format='%h %s' 2>/dev/null | cut -c1-100) $(git -C "$REPO" status --porcelain 2>/dev/null | grep -c . ) changed files"

# ---- 1. wheels ----------------------------------------------------------------------------------
install_wheels() {
  if [ "$WHEELS" = none ] || ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    stamp "wheels: none in '$WHEELS': using $PY's own packages"
    return
  fi
  local tag mismatch
  tag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  mismatch=$(cd "$WHEELS" && ls *.whl | grep -E -- '-cp3[0-9]+-cp3[0-9]+-' | grep -v -- "-$tag-$tag-")
  if [ -n "$mismatch" ]; then
    stamp "wheels: built for another Python than $tag ($(echo $mismatch)): not installed; using $PY's own packages"
    return
  fi
  rm -rf "$SITE"
  if timed 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
       --disable-pip-version-check --target "$SITE" "$WHEELS"/*.whl; then
    export PYTHONPATH=$REPO:$SITE
    stamp "wheels: installed $(ls "$WHEELS"/*.whl | wc -l) into $SITE: $(cd "$WHEELS" && ls *.whl | sed 's/-py3.*//;s/-cp3.*//' | tr '\n' ' ')"
  elif rm -rf "$SITE" && timed 120 "$PY" -c 'import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])' "$SITE" "$WHEELS"/*.whl; then
    # no pip there: a wheel is a zip of the importable files, which is all a run needs
    export PYTHONPATH=$REPO:$SITE
    stamp "wheels: pip install failed; unzipped $(ls "$WHEELS"/*.whl | wc -l) wheels into $SITE instead"
  else
    stamp "wheels: pip install and unzip failed: using $PY's own packages"
    rm -rf "$SITE"
  fi
}
install_wheels

# ---- 2. environment -----------------------------------------------------------------------------
if [ "$DEVICE" = cuda ]; then
  timed 30 nvidia-smi || stamp "nvidia-smi failed (status $?)"
  timed 30 nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,compute_mode --format=csv \
    || true
fi
timed 120 "$PY" scripts/gpu_env.py --out "$OUT/env.json" --device "$DEVICE" --site "$SITE"
env_rc=$?
if [ "$env_rc" = 3 ] && [ -d "$SITE/transformers" ]; then
  stamp "FALLBACK: the carried transformers does not import here; using the image's"
  mkdir -p "$WORK/disabled" && rm -rf "$WORK/disabled/"*
  mv "$SITE"/transformers "$SITE"/transformers-*.dist-info "$WORK/disabled/" 2>/dev/null
  timed 120 "$PY" scripts/gpu_env.py --out "$OUT/env.json" --device "$DEVICE" --site "$SITE"
  env_rc=$?
fi
if [ "$env_rc" != 0 ] && [ "$env_rc" != 3 ]; then
  stamp "environment check failed (status $env_rc): memcalc/validate cannot run here; see env.json"
  VALIDATE_RC=4
  exit 4
fi

# ---- 3. validation matrix -----------------------------------------------------------------------
if [ "${RESUME:-1}" = 0 ]; then rm -rf "$RESULTS" "$WORK/$MATRIX.md" "$SNAPS"; fi
[ -f "$RESULTS" ] && stamp "resuming: $(wc -l < "$RESULTS") rows already in $RESULTS"
args=(-m validate run --matrix "$MATRIX" --device "$DEVICE" --out "$RESULTS" --tolerance "$TOL" --steps "$STEPS")
[ -n "${LIMIT:-}" ] && args+=(--limit "$LIMIT")
[ -n "${ONLY:-}" ] && args+=(--only "$ONLY")
[ "$DEVICE" = cuda ] && [ "${SNAPSHOTS:-1}" != 0 ] && args+=(--cuda-snapshots "$SNAPS")
budget=${VALIDATE_S:-$(( $(left) - TP_S - 25 ))}
[ "$budget" -gt $(( $(left) - 20 )) ] && budget=$(( $(left) - 20 ))
stamp "validate: ${budget}s budget: $PY ${args[*]}"
start_syncer
timed "$budget" "$PY" "${args[@]}"
VALIDATE_RC=$?
[ "$VALIDATE_RC" = 124 ] && stamp "validate: cut at its ${budget}s budget (a warm rerun resumes)"
sync_results

# ---- 4. throughput ------------------------------------------------------------------------------
if [ "$TP_S" -gt 0 ]; then
  tp_budget=$TP_S
  [ "$tp_budget" -gt $(( $(left) - 20 )) ] && tp_budget=$(( $(left) - 20 ))
  tp_args=(--device "$DEVICE" --out "$OUT/throughput.json" --budget $((tp_budget * 3 / 4)))
  [ "$DEVICE" = cpu ] && tp_args+=(--tiny)
  # shellcheck disable=SC2206
  tp_args+=(${THROUGHPUT_ARGS:-})
  stamp "throughput: ${tp_budget}s budget"
  timed "$tp_budget" "$PY" scripts/gpu_throughput.py "${tp_args[@]}" || stamp "throughput: status $?"
fi

stamp "done in $(( $(date +%s) - START ))s"
exit "$VALIDATE_RC"
