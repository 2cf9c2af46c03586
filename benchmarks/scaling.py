"""Scaling on CPU: one process vs FSDP2, TP and PP on two processes (gloo).

For each model config and layout this trains a few steps with the real
``Trainer`` (every process pinned to one thread, so each rank gets one core)
and reports, per layout:

* tokens/s over the whole job (global tokens per step / median step time,
  first steps excluded);
* peak resident memory of the largest rank (``ru_maxrss``). It includes the
  Python and torch runtime (~0.3 GiB), and glibc keeps the freed FSDP2
  all-gather / reduce-scatter buffers in its heap, so it understates what
  sharding saves; ``MALLOC_MMAP_THRESHOLD_=1048576`` returns them to the OS at
  once (RSS then tracks live memory, at a large cost in speed);
* the bytes of parameters, gradients and optimizer state the largest rank
  holds, counted from its local shards (``DTensor.to_local()``).

Target: FSDP2 on 2 ranks holds at most 0.55x of one process's
param + grad + optimizer bytes.

    python benchmarks/scaling.py [--steps 8] [--configs debugmodel,wide512] [--layouts single,fsdp2,tp2,pp2]

Configs: ``debugmodel`` is the llama3 flavor as shipped (dim 256, 6 layers);
``wide512`` (dim 512, 8 layers, 8 heads, ~29M parameters) is a flavor this
script adds to an in-process copy of the llama3 spec, registered as
``llama3_scaling`` with ``titan_core.register_train_spec``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
FSDP2_TARGET = 0.55


@dataclasses.dataclass(frozen=True)
class Config:
    spec: str
    flavor: str
    seq_len: int
    global_batch: int


CONFIGS = {
    "debugmodel": Config("llama3", "debugmodel", seq_len=128, global_batch=8),
    "wide512": Config("llama3_scaling", "wide512", seq_len=128, global_batch=4),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    nproc: int
    args: tuple[str, ...]
    dp: int  # data-parallel degree: the local batch is the global batch / dp


LAYOUTS = {
    "single": Layout(1, (), dp=1),
    "fsdp2": Layout(2, ("--parallelism.dp_shard=2",), dp=2),
    "tp2": Layout(2, ("--parallelism.tp=2",), dp=1),
    "pp2": Layout(2, ("--parallelism.pp=2", "--parallelism.pp_schedule=1F1B"), dp=1),
}


def register_scaling_spec() -> None:
    """The llama3 spec plus a ``wide512`` flavor, under its own name (in this process only)."""
    import titan_core
    from titan_llama.flavors import llama3_flavors
    from titan_llama.model import LlamaArgs
    from titan_llama.spec import llama3_spec

    wide = LlamaArgs(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, vocab_size=None, multiple_of=256,
                     rope_theta=500000.0, max_seq_len=2048)
    spec = dataclasses.replace(llama3_spec, name="llama3_scaling", flavors={**llama3_flavors, "wide512": wide})
    titan_core.register_train_spec(spec)


# ---------------------------------------------------------------- worker (one per rank)


def local_bytes(tensors: Any) -> int:
    """Bytes of the local shards of ``tensors`` (plain tensors count whole)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def state_bytes(trainer: Any) -> dict[str, int]:
    import torch

    params = [p for part in trainer.model_parts for p in part.parameters()]
    grads = [p.grad for p in params if p.grad is not None]
    optim = [v for opt in trainer.optimizer.optimizers for s in opt.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
    return {"param_bytes": local_bytes(params), "grad_bytes": local_bytes(grads), "optim_bytes": local_bytes(optim)}


def worker(overrides: list[str], out_dir: Path) -> None:
    import torch

    from titan_core.parallel import distributed
    from titan_core.plan.resolve import resolve_config
    from titan_core.runtime import launch_env
    from titan_core.train.trainer import Trainer

    torch.set_num_threads(1)
    register_scaling_spec()
    pairs = [tuple(o[2:].split("=", 1)) for o in overrides]
    resolved = resolve_config(config_source=None, override_pairs=pairs, world_size=launch_env.world_size_from_env())
    trainer = Trainer(resolved)
    trainer.setup()
    trainer.train()  # the last step's gradients are kept: zero_grad runs at the start of a step
    result: dict[str, Any] = {
        **state_bytes(trainer),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "n_params": trainer.n_params,
    }
    if trainer.is_rank0:
        lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
        result["step_times"] = [json.loads(line)["step_time_s"] for line in lines]
    (out_dir / f"rank{trainer.proc.rank}.json").write_text(json.dumps(result))
    distributed.destroy()


# ---------------------------------------------------------------- driver


def run_layout(config: Config, layout: Layout, *, steps: int, work: Path) -> dict[str, Any]:
    out_dir = Path(tempfile.mkdtemp(dir=work))
    overrides = [
        f"--model.spec={config.spec}", f"--model.flavor={config.flavor}", f"--training.steps={steps}",
        f"--training.seq_len={config.seq_len}", f"--training.local_batch_size={config.global_batch // layout.dp}",
        "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1", f"--job.run_dir={out_dir / 'run'}", *layout.args,
    ]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(layout.nproc)] \
        if layout.nproc > 1 else [sys.executable]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([*launch, str(SCRIPT), "--worker", str(out_dir), *overrides], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(layout.nproc)]
    timed = ranks[0]["step_times"][2:] or ranks[0]["step_times"]  # the first steps build kernels
    tokens_per_step = config.global_batch * config.seq_len
    return {
        "tokens_per_s": tokens_per_step / statistics.median(timed),
        "peak_rss": max(r["peak_rss_bytes"] for r in ranks),
        "state": max(r["param_bytes"] + r["grad_bytes"] + r["optim_bytes"] for r in ranks),
        "n_params": ranks[0]["n_params"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.worker is not None:
        worker(rest, args.worker)
        return
    layouts = args.layouts.split(",")
    mib = 2**20
    print(f"{'config':<11} {'layout':<7} {'ranks':>5} {'tokens/s':>9} {'speedup':>8} {'peak RSS/rank MiB':>18} "
          f"{'param+grad+optim MiB/rank':>26} {'vs 1 proc':>9}")
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory() as work:
        for cname in args.configs.split(","):
            config = CONFIGS[cname]
            base: dict[str, Any] | None = None
            for lname in layouts:
                layout = LAYOUTS[lname]
                r = run_layout(config, layout, steps=args.steps, work=Path(work))
                base = base or r  # the first layout (single by default) is the baseline
                ratio = r["state"] / base["state"]
                print(f"{cname:<11} {lname:<7} {layout.nproc:>5} {r['tokens_per_s']:>9.0f} "
                      f"{r['tokens_per_s'] / base['tokens_per_s']:>7.2f}x {r['peak_rss'] / mib:>18.0f} "
                      f"{r['state'] / mib:>26.1f} {ratio:>8.2f}x", flush=True)
                if lname == "fsdp2" and layouts[0] == "single":
                    verdicts.append(f"{cname}: FSDP2 holds {ratio:.3f}x of one process's param+grad+optim bytes "
                                    f"(target <= {FSDP2_TARGET}): {'PASS' if ratio <= FSDP2_TARGET else 'FAIL'}")
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
