"""Worker of test_slice_reads.py: one rank of ``torchrun``, loading an HF folder under several layouts.

For each layout (``name:section.key=value,...``) it builds the real Trainer up to its
sharded model, runs ``load_initial_weights`` and writes ``<run_dir>/result-rank<N>.json`` with:
the tensor bytes this rank read, the bytes of its own shards (what it should read), the
full bytes of the tensors it holds a shard of, the bytes of the whole model, and whether every parameter's full tensor equals the one
``from_hf`` gives from the whole file (``torch.equal``).

    python -m torch.distributed.run --standalone --nproc-per-node N _slice_load_worker.py HF_DIR RUN_DIR LAYOUT...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def reference(folder: Path, adapter, model_args) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    raw: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        raw.update(load_file(file))
    return adapter.from_hf(raw, model_args)


class WithoutRowMap:
    """The spec's adapter minus its optional ``from_hf_rows``: the whole-tensor fallback."""

    def __init__(self, adapter) -> None:  # type: ignore[no-untyped-def]
        self.runtime_fields = adapter.runtime_fields
        self.model_args_from_hf, self.hf_config = adapter.model_args_from_hf, adapter.hf_config
        self.from_hf, self.to_hf = adapter.from_hf, adapter.to_hf


def run_layout(folder: Path, run_dir: Path, name: str, pairs: list[tuple[str, str]]) -> dict[str, object]:
    """``name`` starting with ``whole_``: load through an adapter without a row map."""
    import dataclasses

    from titan_core import Trainer
    from titan_core.plan.resolve import resolve_config
    from titan_core.weights.load import load_initial_weights

    base = [("model.spec", "llama3"), ("checkpoint.initial_load", str(folder)), ("training.seq_len", "32"), ("training.local_batch_size", "4"),
            ("job.run_dir", str(run_dir / name))]
    trainer = Trainer(resolve_config(config_source=None, override_pairs=base + pairs, world_size=int(os.environ["WORLD_SIZE"])))
    trainer.init_distributed()
    trainer.build_tokenizer_and_data()
    model = trainer.build_model()
    trainer.apply_converters(model)
    trainer.build_model_parts(model)
    trainer.materialize_and_init()
    spec = trainer.spec
    if name.startswith("whole_"):
        spec = dataclasses.replace(spec, state_dict_adapter=WithoutRowMap(spec.state_dict_adapter))
    stats = load_initial_weights(str(folder), spec=spec, model_parts=trainer.model_parts,
                                 model_args=trainer.model_args, ties=trainer.ties, is_rank0=False)
    assert stats is not None
    aliases = {alias for _, alias in trainer.ties}
    expected = reference(folder, trainer.spec.state_dict_adapter, trainer.model_args)
    own_bytes, full_bytes, mismatched, placements = 0, 0, [], set()
    for part in trainer.model_parts:
        for fqn, param in part.named_parameters():  # each tied pair once
            local = param.to_local() if isinstance(param, DTensor) else param
            if fqn not in aliases:
                own_bytes += local.numel() * 4  # the folder is float32
                full_bytes += param.numel() * 4
            if isinstance(param, DTensor):
                placements.add(str(tuple(param.placements)))
            full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
            if not torch.equal(full, expected[fqn]):
                mismatched.append(fqn)
    return {"bytes_read": stats.bytes_read, "own_bytes": own_bytes, "full_bytes": full_bytes, "total_bytes": stats.bytes_total,
            "read_whole": stats.read_whole, "mismatched": mismatched, "placements": sorted(placements)}


def main() -> None:
    folder, run_dir, layouts = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    results: dict[str, object] = {}
    for layout in layouts:
        name, _, spec = layout.partition(":")
        pairs = [tuple(p.split("=", 1)) for p in spec.split(",") if p]
        results[name] = run_layout(folder, run_dir, name, pairs)  # type: ignore[arg-type]
    # One file per rank: two ranks printing long lines to one pipe can interleave them.
    out = run_dir / f"result-rank{dist.get_rank()}.json"
    out.write_text(json.dumps({"rank": dist.get_rank(), **results}), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
