#!/usr/bin/env bash
# The GPU checks as ONE command that returns its numbers within 540 s on a bare H200, the
# install of the carried wheels included:
#
#   here:   bash scripts/gpu/fetch_wheels.sh
#   there:  device run, carry [".whl"], timeout_s 570, command:  bash scripts/gpu/checks.sh
#
# * One global deadline (CHECKS_BUDGET_S, 540 s from the script's start): a check starts only
#   if its own time limit still fits before it, else it is recorded as skipped. The limits of
#   the GPU plan add up to at most 540 s (tests/test_gpu_checks_script.py asserts it).
# * First the install, then a smoke test (versions, every titan module imported, 4 training
#   steps on the device); if either fails, the script stops there and the summary says why.
# * After EVERY check, $OUT/summary.md and $OUT/runs.tar.gz (each run's metrics, console and
#   exit-code files) are rewritten: a kill at any moment still returns the numbers so far.
#   $OUT holds at most 4 files: checks.log, summary.md, runs.tar.gz, memory_snapshot.pickle.
# * Headline figures first (compiled Llama 3 bf16 against float8, 1B and 8B layer widths with
#   the real 128,256-token vocabulary), then MoE at real width, FlexAttention document masking,
#   a memory snapshot, titan-generate on the device, and the slot for one rank of the 70B layout.
# * Every check has an expected exit code; the summary says pass or fail against it.
#
# CHECKS_PLAN=cluster runs the other plan, as a device command of its own (same carry and timeout): the
# install and the smoke test, then one rank of a 70B cluster layout (Llama 3 70B, FSDP 8 x TP 8 = 64
# ranks, seq 8192, local batch 1, AC full): its memory plan (--dry-run) and that rank trained for real
# on this GPU under the fake process group (--rehearse-rank 0), the summary setting the plan against
# the measured peak.
#
# CHECKS_ON_CPU=1 runs the same plan on a CPU with tiny shapes and no compile (CI runs it so the
# script cannot rot; its numbers mean nothing). CHECKS_PLAN_ONLY=1 prints the plan (name, limit,
# expected exit code) and runs nothing.
set -u
cd "$(dirname "$0")/../.."
START=$(date +%s)
ON_CPU=${CHECKS_ON_CPU:-0}
# On a CPU (CI; other jobs on the same cores) the limits only guard against a hang: a check gets at
# least CHECKS_CPU_MIN_LIMIT_S and the budget is 1200 s (a run takes ~6 s of CPU per check).
if [ "$ON_CPU" = 1 ]; then BUDGET=${CHECKS_BUDGET_S:-1200}; else BUDGET=${CHECKS_BUDGET_S:-540}; fi
CPU_MIN_LIMIT_S=${CHECKS_CPU_MIN_LIMIT_S:-150}
RESERVE_S=5  # kept back at the end for the last summary and archive
OUT=${OUT:-/tmp/titan-gpu-checks}
RUNS=${RUNS:-/tmp/titan-gpu-runs}
PYTHON=${PYTHON:-python3}
PLAN_ONLY=${CHECKS_PLAN_ONLY:-0}
PLAN=${CHECKS_PLAN:-headline}
case "$PLAN" in
  headline|cluster) ;;
  *) echo "checks.sh: CHECKS_PLAN=$PLAN is not a plan; use CHECKS_PLAN=headline (the default) or cluster" >&2; exit 2 ;;
esac
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} PYTHON RUNS ON_CPU
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/titan-inductor-cache}  # shared by the checks
if [ "$PLAN_ONLY" != 1 ]; then
  rm -rf "$RUNS" && mkdir -p "$OUT" "$RUNS"
  rm -f "$OUT/checks.log" "$OUT/summary.md" "$OUT/runs.tar.gz" "$OUT/memory_snapshot.pickle"
  exec > >(tee "$OUT/checks.log") 2>&1
fi

# ---- shapes: the GPU plan, or tiny ones on a CPU ----------------------------------------------------
if [ "$ON_CPU" = 1 ]; then
  DEVICE=cpu
  COMPILE=()  # compiling on a CPU costs ~30 s a run; the compiled path is the GPU's to check
  TINY=(--flavor debugmodel --llama3.n_layers=1 --training.seq_len=64 --training.local_batch_size=2)
  HEAD_1B=("${TINY[@]}") HEAD_8B=("${TINY[@]}")
  MOE=(--flavor debugmoe --qwen3.n_layers=1 --training.seq_len=64 --training.local_batch_size=2)
  STEPS=(--training.steps=4 --metrics.log_freq=2)
  # A 2 x 2 layout of the tiny model: the cluster plan's plumbing, not its figures.
  CLUSTER=(--flavor debugmodel --llama3.n_layers=2 --nnodes 2 --nproc-per-node 2 --parallelism.dp_shard=2
           --parallelism.tp=2 --training.seq_len=64 --training.local_batch_size=2 --activation_checkpoint.mode=full)
else
  DEVICE=cuda
  COMPILE=(--compile.enable=true)
  # Llama 3.2 1B and Llama 3.1 8B layer widths, 4 layers, the real 128,256-token vocabulary (the
  # built-in corpus through the built-in tokenizer feeds them: no tokenizer or data to carry).
  HEAD_1B=(--flavor 1B --llama3.n_layers=4 --training.seq_len=2048 --training.local_batch_size=4)
  HEAD_8B=(--flavor 8B --llama3.n_layers=4 --training.seq_len=2048 --training.local_batch_size=4)
  # Qwen3-30B-A3B as published (128 experts, top 8, width 2048), cut to 2 layers.
  MOE=(--flavor 30B-A3B --qwen3.n_layers=2 --training.seq_len=2048 --training.local_batch_size=4)
  # log_freq 5: step 1 (compile) alone, then windows of 5 steps; the summary takes the windows after the first.
  STEPS=(--training.steps=15 --metrics.log_freq=5)
  # One rank of Llama 3 70B on 64 GPUs (8 nodes of 8), FSDP 8 x TP 8, as the issue that asked for it names it.
  CLUSTER=(--flavor 70B --nnodes 8 --nproc-per-node 8 --parallelism.dp_shard=8 --parallelism.tp=8
           --training.seq_len=8192 --training.local_batch_size=1 --activation_checkpoint.mode=full)
fi
SMALL=(--flavor debugmodel --training.seq_len=256 --training.local_batch_size=2)
export DEVICE

# ---- the checks, as functions (each runs in its own bash under `timeout`) ---------------------------
# train NAME SPEC ARGS...: one titan-train run into $RUNS/NAME (the check's console goes to $RUNS/NAME/console.txt).
train() {
  local name=$1 spec=$2; shift 2
  mkdir -p "$RUNS/$name"
  echo "--- titan-train --spec $spec $*"
  "$PYTHON" -m titan_core --spec "$spec" --job.run_dir="$RUNS/$name" --training.device="$DEVICE" \
    --metrics.report=false "$@"
}
install_wheels() {
  if [ "$ON_CPU" = 1 ]; then echo "CPU mode: the current environment ($PYTHON) is used"; return 0; fi
  ls .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/: run scripts/gpu/fetch_wheels.sh here and carry .whl"; return 1; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
}
smoke() {
  "$PYTHON" scripts/gpu/smoke.py --device "$DEVICE" || return $?
  train smoke llama3 "${SMALL[@]}" --training.steps=4 --metrics.log_freq=1
}
bf16_1B() { train bf16_1B llama3 "${HEAD_1B[@]}" "${STEPS[@]}" "${COMPILE[@]}"; }
float8_1B() { train float8_1B llama3 "${HEAD_1B[@]}" "${STEPS[@]}" "${COMPILE[@]}" --converters float8; }
bf16_8B() { train bf16_8B llama3 "${HEAD_8B[@]}" "${STEPS[@]}" "${COMPILE[@]}"; }
float8_8B() { train float8_8B llama3 "${HEAD_8B[@]}" "${STEPS[@]}" "${COMPILE[@]}" --converters float8; }
moe_bf16() {
  train moe_bf16 qwen3 "${MOE[@]}" "${STEPS[@]}" || return $?
  # The experts must have run torch._grouped_mm in bfloat16 (on a CPU: whichever path the metrics name).
  local want=1; [ "$ON_CPU" = 1 ] && want=any
  "$PYTHON" scripts/gpu/expect.py "$RUNS/moe_bf16/metrics.jsonl" moe_grouped_mm "$want"
}
flex_doc_masking() { train flex_doc_masking llama3 "${HEAD_1B[@]}" "${STEPS[@]}" "${COMPILE[@]}" --data.document_masking=true; }
memory_snapshot() {
  train memory_snapshot llama3 "${SMALL[@]}" --training.steps=4 --metrics.log_freq=2 --profiling.enable=true \
    --profiling.memory_snapshot=true --profiling.start_step=2 --profiling.steps=2 \
    --checkpoint.enable=true --checkpoint.interval=4 || return $?
  find "$RUNS/memory_snapshot" \( -name '*.pickle' -o -name 'breakdown.json' \) -printf '%p %s bytes\n'
  if [ "$DEVICE" = cuda ]; then
    local pickle; pickle=$(find "$RUNS/memory_snapshot" -name memory_snapshot.pickle | head -1)
    [ -n "$pickle" ] || { echo "no memory_snapshot.pickle was written"; return 1; }
    [ "$(stat -c %s "$pickle")" -le $((40 * 2**20)) ] && cp "$pickle" "$OUT/memory_snapshot.pickle"
  fi
  return 0
}
generate() {
  "$PYTHON" -m titan_core.commands.generate "$RUNS/memory_snapshot" --prompt "The quick brown fox" \
    --max-new-tokens 16 --device "$DEVICE"
}
plan_70B() {
  # The dry run's memory plan of that layout, per kind of rank (summarize.py reads rank 0's row).
  mkdir -p "$RUNS/plan_70B"
  "$PYTHON" -m titan_core --spec llama3 "${CLUSTER[@]}" --job.run_dir="$RUNS/plan_70B" --training.device="$DEVICE" \
    --dry-run
}
rank_70B() {
  # Rank 0 of the layout trained for real on this device under the fake process group: its real peak memory.
  train rank_70B llama3 "${CLUSTER[@]}" --rehearse-rank=0 --training.steps=4 --metrics.log_freq=1
}
export -f train install_wheels smoke bf16_1B float8_1B bf16_8B float8_8B moe_bf16 flex_doc_masking \
  memory_snapshot generate plan_70B rank_70B
export OUT
# Arrays cannot be exported: each check's bash gets them as declarations.
SHAPES=$(declare -p COMPILE HEAD_1B HEAD_8B MOE STEPS SMALL CLUSTER)

# ---- the runner --------------------------------------------------------------------------------------
# check NAME LIMIT_S EXPECTED_RC [STOP_ON_FAIL]: run the function NAME under `timeout LIMIT_S` if it fits
# before the deadline; write $RUNS/NAME/{limit,expected,rc,seconds,status}; rewrite summary and archive.
STOPPED=""
check() {
  local name=$1 limit=$2 expected=$3 stop=${4:-}
  if [ "$PLAN_ONLY" = 1 ]; then echo "$name $limit $expected"; return 0; fi
  [ "$ON_CPU" = 1 ] && [ "$limit" -gt 0 ] && [ "$limit" -lt "$CPU_MIN_LIMIT_S" ] && limit=$CPU_MIN_LIMIT_S
  local dir="$RUNS/$name" now; now=$(date +%s)
  mkdir -p "$dir"
  echo "$name" >> "$RUNS/order"
  echo "$limit" > "$dir/limit"; echo "$expected" > "$dir/expected"
  if [ -n "$STOPPED" ]; then
    echo "skipped: $STOPPED" > "$dir/status"
  elif [ "$limit" -le 0 ]; then
    echo "skipped: no time is budgeted for it in this plan (CHECKS_PLAN=cluster runs it as a command of its own)" > "$dir/status"
  elif [ $((now + limit)) -gt $((START + BUDGET - RESERVE_S)) ]; then
    echo "skipped: its ${limit} s limit no longer fits ($((START + BUDGET - RESERVE_S - now)) s left of ${BUDGET} s)" > "$dir/status"
  else
    echo; echo "=== $name (limit ${limit} s, expected exit code $expected, $((now - START)) s into the run)"
    # timeout signals the check's whole process group; functions arrive through export -f.
    timeout --kill-after=5 "$limit" bash -c "$SHAPES; $name" 2>&1 | tee -a "$dir/console.txt"
    local rc=${PIPESTATUS[0]}
    echo "$rc" > "$dir/rc"; echo $(( $(date +%s) - now )) > "$dir/seconds"
    if [ "$rc" = "$expected" ]; then
      echo pass > "$dir/status"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      echo "fail: killed at its ${limit} s limit" > "$dir/status"
    else
      echo "fail: exit code $rc, expected $expected" > "$dir/status"
    fi
    if [ "$rc" != "$expected" ] && [ -n "$stop" ]; then
      STOPPED="$name failed (see its row); nothing after it ran"
    fi
  fi
  echo "--- $name: $(cat "$dir/status")"
  publish
}
publish() {
  "$PYTHON" scripts/gpu/summarize.py "$RUNS" --budget "$BUDGET" --elapsed $(( $(date +%s) - START )) \
    > "$OUT/summary.md.tmp" 2>&1 && mv "$OUT/summary.md.tmp" "$OUT/summary.md"
  tar -czf "$OUT/runs.tar.gz.tmp" -C "$RUNS" --exclude='checkpoints' --exclude='*.distcp' --exclude='*.pickle' \
    --exclude='trace.json' . && mv "$OUT/runs.tar.gz.tmp" "$OUT/runs.tar.gz"
  echo "--- summary.md and runs.tar.gz rewritten after $(wc -l < "$RUNS/order") check(s)"
}

if [ "$ON_CPU" != 1 ] && [ "$PLAN_ONLY" != 1 ]; then
  export PYTHONPATH=/tmp/site
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv 2>&1 | tee "$RUNS/gpu.txt"
fi
# The plan, in order: name, time limit (s), expected exit code, [stop the run when it fails].
check install_wheels 25 0 stop
check smoke 60 0 stop
if [ "$PLAN" = cluster ]; then
  check plan_70B 60 0 stop
  check rank_70B 300 0
else
  check bf16_1B 70 0
  check float8_1B 75 0
  check bf16_8B 75 0
  check float8_8B 75 0
  check moe_bf16 45 0
  check flex_doc_masking 55 0
  check memory_snapshot 30 0
  check generate 20 0
  check rank_70B 0 0  # a slot, costing nothing here: the 540 s are spent; CHECKS_PLAN=cluster runs it
fi
[ "$PLAN_ONLY" = 1 ] || { echo; cat "$OUT/summary.md"; }
