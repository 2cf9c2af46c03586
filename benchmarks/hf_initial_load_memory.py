"""Peak memory of a 2-rank FSDP2 ``--checkpoint.initial_load`` of a ~110M-parameter Hugging Face model.

Saves a random ``LlamaForCausalLM`` (dim 768, 12 layers (``--layers``), 12 heads, 4 kv heads, MLP 2048,
vocabulary 16384, untied; 110M parameters, 440 MB in fp32) with ``save_pretrained`` in
~200 MB shards, then on 2 ranks (gloo, FSDP2 dp_shard=2) builds the real ``Trainer`` up to
its sharded meta model and measures, per rank, with a thread sampling
``/proc/self/status`` every millisecond:

* ``load peak``: the highest anonymous resident memory (``RssAnon``: heap, not file
  pages) while ``to_empty`` + buffer init + ``load_initial_weights`` run, minus what the
  rank held just before (runtime, tokenizer, data): the shard itself plus what loading
  needs on top of it;
* the budget: this rank's shard of the parameters + the largest single tensor, + 20%;
* the tensor bytes the rank read from the files, beside the whole model's (each rank
  reads only the rows of its own shards).

Exit status 1 if a rank goes over its budget.

    python benchmarks/hf_initial_load_memory.py [--keep DIR] [--layers N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def make_model(folder: Path, layers: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16384, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
                         num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                         tie_word_embeddings=False, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(config).float()
    model.save_pretrained(folder, max_shard_size="200MB")
    return sum(p.numel() for p in model.parameters())


class RssSampler:
    """Max of RssAnon (KiB) over a window, sampled every millisecond by a daemon thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
        return 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.001)

    def __enter__(self) -> RssSampler:
        self.peak = self.now()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def worker(folder: Path, run_dir: Path) -> None:
    import torch
    from torch.distributed.tensor import DTensor

    from titan_core import Trainer
    from titan_core.plan.resolve import resolve_config
    from titan_core.weights.load import load_initial_weights

    # The spec is named: a default install holds two (llama3 and qwen3); the folder is a LlamaForCausalLM.
    pairs = [("model.spec", "llama3"), ("checkpoint.initial_load", str(folder)), ("parallelism.dp_shard", "2"), ("training.seq_len", "32"),
             ("training.local_batch_size", "1"), ("job.run_dir", str(run_dir)),
             ("training.cpu_malloc_tuning", "false")]
    trainer = Trainer(resolve_config(config_source=None, override_pairs=pairs, world_size=2))
    trainer.init_distributed()
    trainer.build_tokenizer_and_data()
    model = trainer.build_model()
    trainer.apply_converters(model)
    trainer.build_model_parts(model)
    before = RssSampler.now()
    with RssSampler() as sampler:
        trainer.materialize_and_init()  # with initial_load: to_empty and buffers only
        stats = load_initial_weights(str(folder), spec=trainer.spec, model_parts=trainer.model_parts,
                                     model_args=trainer.model_args, ties=trainer.ties, is_rank0=trainer.is_rank0)
    assert stats is not None
    params = list(trainer.model_parts[0].parameters())
    shard = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in params)
    largest = max(p.numel() * p.element_size() for p in params)
    # Each rank writes its own file: two ranks printing to one pipe can interleave their lines.
    rank = torch.distributed.get_rank()
    (run_dir.parent / f"result-{rank}.json").write_text(json.dumps({
        "rank": rank, "before_mib": before / 1024, "peak_mib": sampler.peak / 1024,
        "load_peak_mib": (sampler.peak - before) / 1024, "shard_mib": shard / 2**20, "largest_mib": largest / 2**20,
        "read_mib": stats.bytes_read / 2**20, "model_mib": stats.bytes_total / 2**20,
    }))
    torch.distributed.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, default=None, help="save the HF folder here (default: a temp folder)")
    parser.add_argument("--layers", type=int, default=12, help="decoder layers (12: the figure in docs/benchmarks.md)")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.run_dir)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp) / "hf"
        if not (folder / "config.json").is_file():
            n = make_model(folder, args.layers)
            print(f"saved a {n / 1e6:.1f}M-parameter LlamaForCausalLM to {folder} "
                  f"({len(list(folder.glob('*.safetensors')))} safetensors files)", flush=True)
        # A fixed mmap threshold: glibc then maps every buffer of 64 KiB or more on its own and
        # unmaps it when freed, so RSS follows live memory (its default raises the threshold
        # as buffers are freed and keeps later ones in a heap that only grows).
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(HERE),
             "--worker", str(folder), "--run-dir", str(Path(tmp) / "run")],
            env=env, capture_output=True, text=True, timeout=1200,
        )
        results = sorted(Path(tmp).glob("result-*.json"))
        rows = [json.loads(path.read_text()) for path in results]
        if proc.returncode != 0 or len(rows) != 2:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            return 1
    over = False
    print("| rank | before load (MiB) | load peak above it (MiB) | shard (MiB) | largest tensor (MiB) | "
          "budget: (shard + largest) x 1.2 (MiB) | within | read from the files (MiB) | model in the files (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: r["rank"]):
        budget = (r["shard_mib"] + r["largest_mib"]) * 1.2
        ok = r["load_peak_mib"] <= budget
        over |= not ok
        print(f"| {r['rank']} | {r['before_mib']:.0f} | {r['load_peak_mib']:.0f} | {r['shard_mib']:.0f} | "
              f"{r['largest_mib']:.0f} | {budget:.0f} | {'yes' if ok else 'NO'} | {r['read_mib']:.0f} | "
              f"{r['model_mib']:.0f} |")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
