#!/usr/bin/env bash
# The GPU checks of issues 3 and 5 as one run, for a session that is lent a GPU machine:
#
#   here:   bash scripts/gpu/fetch_wheels.sh
#   there:  device run, carry [".whl"], command:  bash scripts/gpu/checks.sh   (timeout_s 540)
#
# It installs .whl/ into /tmp/site (the GPU image has its own CUDA torch and no package index),
# runs each check below with its own time limit, and writes to $OUT: checks.log (everything),
# summary.md (one row per run: exit code, losses, step time, tokens/s, MFU, memory) and
# runs.tar.gz (each run's metrics.jsonl, conversion table and comparison files).
# Checks that need no GPU still run on CPU with CHECKS_ON_CPU=1 (to test this script; the
# numbers then mean nothing).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/titan-gpu-checks}
RUNS=${RUNS:-/tmp/titan-gpu-runs}
PYTHON=${PYTHON:-python3}
rm -rf "$RUNS" && mkdir -p "$OUT" "$RUNS"
exec > >(tee "$OUT/checks.log") 2>&1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

if [ "${CHECKS_ON_CPU:-0}" = 1 ]; then
  BIG=(--flavor debugmodel --training.seq_len=128 --training.local_batch_size=2)
  SMALL=(--flavor debugmodel --training.seq_len=128 --training.local_batch_size=2)
  STEPS=3
else
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing .whl/ failed: run scripts/gpu/fetch_wheels.sh here and carry .whl"; exit 1; }
  export PYTHONPATH=/tmp/site
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv
  # 1B_untied: dim 2048, 16 layers; big enough for MFU and float8 speed to mean something.
  BIG=(--flavor 1B_untied --training.seq_len=2048 --training.local_batch_size=4)
  SMALL=(--flavor debugmodel --training.seq_len=2048 --training.local_batch_size=8)
  STEPS=12
fi
"$PYTHON" -c "import torch, torchao, titan_core; print('torch', torch.__version__, '| torchao', torchao.__version__,
'| cuda', torch.cuda.is_available() and torch.cuda.get_device_name(), torch.cuda.is_available() and torch.cuda.get_device_capability())"

# check NAME SECONDS ARGS...: one titan-train run into $RUNS/NAME; its exit code goes to $RUNS/NAME/rc.
# SPEC=NAME before it picks another spec (default llama3).
check() {
  local name=$1 seconds=$2; shift 2
  mkdir -p "$RUNS/$name"
  echo; echo "=== $name: titan-train $*"
  timeout "$seconds" "$PYTHON" -m titan_core --spec "${SPEC:-llama3}" --metrics.log_freq=1 --job.run_dir="$RUNS/$name" "$@" \
    2>&1 | tee "$RUNS/$name/console.txt"
  echo "${PIPESTATUS[0]}" > "$RUNS/$name/rc"
}

# Issue 3: bf16 autocast by default on CUDA, CUDA memory and MFU against the peak table.
check bf16_debugmodel 120 "${SMALL[@]}" --training.steps=40
check bf16_1B 180 "${BIG[@]}" --training.steps=$STEPS
# Issue 5: real float8 kernels (SM89+), their speed against bf16 at the same shape, and numerics.
check float8_tensorwise_1B 180 "${BIG[@]}" --training.steps=$STEPS --converters float8
check float8_rowwise_1B 180 "${BIG[@]}" --training.steps=$STEPS --converters float8 --float8.recipe=rowwise
check float8_compare 180 "${SMALL[@]}" --training.steps=20 --converters float8 --compare-baseline
# Issue 5 point 4 as typed: on a GPU below SM100 the MX part must stop with its hardware message
# (exit 2); with --mx.emulate=true both converters train.
check float8_mx_as_typed 120 "${SMALL[@]}" --training.steps=5 --converters float8,mx
check float8_mx_emulated 180 "${SMALL[@]}" --training.steps=10 --converters float8,mx --mx.emulate=true
# Issues 19-22, small and quick: FlexAttention training on packed documents (the CUDA path of
# data.document_masking), the MoE experts' torch._grouped_mm in bf16, CUDA memory snapshots
# written next to the traces, and titan-generate on CUDA from the snapshot run's checkpoint.
check doc_masking_flex 180 "${SMALL[@]}" --training.steps=20 --data.document_masking=true
SPEC=qwen3 check qwen3_debugmoe_bf16 150 --flavor debugmoe --training.seq_len=512 --training.local_batch_size=8 --training.steps=20
check memory_snapshot 150 "${SMALL[@]}" --training.steps=6 --profiling.enable=true --profiling.memory_snapshot=true \
  --profiling.start_step=2 --profiling.steps=2 --checkpoint.enable=true --checkpoint.interval=6
echo "=== memory_snapshot files:"; find "$RUNS/memory_snapshot" -name '*.pickle' -o -name '*.json' | grep -v checkpoints
echo "=== generate_cuda: titan-generate on cuda"
timeout 120 "$PYTHON" -m titan_core.commands.generate "$RUNS/memory_snapshot" --prompt "The quick brown fox" \
  --max-new-tokens 16 --device cuda; echo "generate_cuda rc=$?"
# Compiled, last because compiling takes the longest: the float8 speed-up needs fused casts.
check bf16_1B_compiled 240 "${BIG[@]}" --training.steps=$STEPS --compile.enable=true
check float8_tensorwise_1B_compiled 240 "${BIG[@]}" --training.steps=$STEPS --converters float8 --compile.enable=true

"$PYTHON" scripts/gpu/summarize.py "$RUNS" | tee "$OUT/summary.md"
tar -czf "$OUT/runs.tar.gz" -C "$RUNS" --exclude='checkpoints' --exclude='*.distcp' .
