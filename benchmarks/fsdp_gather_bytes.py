"""Bytes FSDP2 all-gathers per step, float32 vs bfloat16 training, on 2 gloo processes.

Each variant is a real ``titan-train --nproc-per-node 2 --parallelism.dp_shard=2`` run of
the llama3 debugmodel. An ``--import`` module (written to a temporary folder) wraps
``torch.distributed.all_gather_single`` and ``all_gather_into_tensor`` in every process and
adds up the bytes of every output buffer they fill (numel x element size; a call nested in
another is counted once), rewriting a per-rank JSON file after each call. FSDP2 calls these
for the parameter all-gathers; nothing else in a training step of this layout all-gathers, so
the total is the parameter traffic (step 1 included). Printed: bytes per step per rank for both dtypes, and the ratio
(expected 0.5: parameters are gathered in the compute dtype, while the float32 shards stay
the master weights). Reduce-scatter traffic is not counted: gradients are reduced in float32
in both runs.

    python benchmarks/fsdp_gather_bytes.py              # 4 steps each
    python benchmarks/fsdp_gather_bytes.py --steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

COUNTER = r'''
import json, os, threading
import torch.distributed as dist

_state = threading.local()
_total = {"bytes": 0, "calls": 0}

def _wrap(fn):
    def counted(output, *args, **kwargs):
        outer = not getattr(_state, "inside", False)
        if outer:
            _total["bytes"] += output.numel() * output.element_size()
            _total["calls"] += 1
            _write()  # after every call: workers may leave with os._exit, which skips atexit
        _state.inside = True
        try:
            return fn(output, *args, **kwargs)
        finally:
            if outer:
                _state.inside = False
    return counted

dist.all_gather_single = _wrap(dist.all_gather_single)
dist.all_gather_into_tensor = _wrap(dist.all_gather_into_tensor)

def _write():
    rank = os.environ.get("RANK")
    if rank is None:  # the launcher imports this module too; only workers gather
        return
    with open(os.path.join(os.environ["GATHER_BYTES_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(_total, f)
'''


def gathered_bytes(dtype: str, steps: int, tmp: Path) -> dict[str, int]:
    out = tmp / dtype
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GATHER_BYTES_OUT": str(out),
           "PYTHONPATH": os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "titan_core", "--nproc-per-node", "2", "--import", "gather_counter",
           "--spec", "llama3", "--flavor", "debugmodel", "--parallelism.dp_shard=2", f"--training.dtype={dtype}",
           f"--training.steps={steps}", "--training.seq_len=32", "--training.local_batch_size=2",
           f"--job.run_dir={tmp / ('run-' + dtype)}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{dtype} run failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    rank0 = json.loads((out / "rank0.json").read_text())
    return {"bytes": int(rank0["bytes"]), "calls": int(rank0["calls"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        (tmp / "gather_counter.py").write_text(COUNTER)
        results = {dtype: gathered_bytes(dtype, args.steps, tmp) for dtype in ("float32", "bfloat16")}
    print(f"FSDP2 all-gather traffic, llama3 debugmodel, 2 gloo processes, {args.steps} steps (rank 0)")
    print(f"{'training.dtype':<16}{'gather calls':>14}{'bytes/step':>16}")
    for dtype, r in results.items():
        print(f"{dtype:<16}{r['calls']:>14}{r['bytes'] / args.steps:>16,.0f}")
    ratio = results["bfloat16"]["bytes"] / results["float32"]["bytes"]
    print(f"ratio bfloat16 / float32: {ratio:.3f}")
    print(json.dumps({"steps": args.steps, "ratio": ratio, **{k: v["bytes"] for k, v in results.items()}}))


if __name__ == "__main__":
    main()
