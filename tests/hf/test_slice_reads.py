"""``initial_load`` of a Hugging Face folder: each rank reads only the slices it owns.

Real ``torchrun`` processes (gloo) load a tiny sharded HF Llama under FSDP2, TP, PP (2
processes) and HSDP, FSDP2 x TP, PP x FSDP2 (4 processes). On every rank the tensor bytes
read equal the bytes of its own shards exactly (so a rank of a sharded layout reads about
1/N of the model, never all of it), and every parameter's full tensor equals what
``from_hf`` gives from the whole file. An adapter without ``from_hf_rows`` still loads
exactly, reading each tensor it holds whole. The SliceReader itself: slices equal
indexing, and a file damaged after it was opened is one clear error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_helpers import REPO, tiny_hf_llama

WORKER = Path(__file__).with_name("_slice_load_worker.py")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny", max_shard_size="300KB")


def spawn(nproc: int, hf_dir: Path, run_dir: Path, *layouts: str) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), str(WORKER),
         str(hf_dir), str(run_dir), *layouts],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [json.loads(f.read_text(encoding="utf-8")) for f in sorted(run_dir.glob("result-rank*.json"))]
    assert len(rows) == nproc, proc.stdout[-4000:] + proc.stderr[-4000:]
    return sorted(rows, key=lambda r: r["rank"])


def check_layout(results: list[dict[str, Any]], name: str, *, ranks_per_copy: int) -> list[dict[str, Any]]:
    per_rank = [r[name] for r in results]
    for rank, r in enumerate(per_rank):
        assert r["mismatched"] == [], f"{name} rank {rank}: loaded values differ in {r['mismatched']}"
        assert r["read_whole"] == 0, name
        assert r["bytes_read"] == r["own_bytes"], f"{name} rank {rank}: read {r['bytes_read']}, owns {r['own_bytes']}"
        # Only the replicated norm weights (0.2% of this model) are read by more than one rank of a copy.
        assert r["bytes_read"] <= r["total_bytes"] / ranks_per_copy * 1.01, f"{name} rank {rank}: {r}"
    return per_rank


def test_two_process_layouts_read_only_their_slices(hf_dir: Path, tmp_path: Path) -> None:
    results = spawn(2, hf_dir, tmp_path, "fsdp2:parallelism.dp_shard=2",
                    "tp2:parallelism.dp_shard=1,parallelism.tp=2", "pp2:parallelism.dp_shard=1,parallelism.pp=2",
                    "whole_fsdp2:parallelism.dp_shard=2")
    fsdp = check_layout(results, "fsdp2", ranks_per_copy=2)
    assert sum(r["bytes_read"] for r in fsdp) == fsdp[0]["total_bytes"]  # the two halves, nothing twice
    tp = check_layout(results, "tp2", ranks_per_copy=2)
    assert "(Shard(dim=1),)" in tp[0]["placements"]  # row-wise TP: a column block of every row
    check_layout(results, "pp2", ranks_per_copy=2)
    # The fallback (an adapter with no row map): exact too, each held tensor read whole.
    for r in (res["whole_fsdp2"] for res in results):
        assert r["mismatched"] == [] and r["read_whole"] > 0
        assert r["bytes_read"] == r["full_bytes"] == r["total_bytes"]


def test_four_process_layouts_read_only_their_slices(hf_dir: Path, tmp_path: Path) -> None:
    results = spawn(4, hf_dir, tmp_path, "hsdp:parallelism.dp_replicate=2,parallelism.dp_shard=2",
                    "fsdp_tp:parallelism.dp_shard=2,parallelism.tp=2",
                    "pp_fsdp:parallelism.dp_shard=2,parallelism.pp=2")
    hsdp = check_layout(results, "hsdp", ranks_per_copy=2)
    assert sum(r["bytes_read"] for r in hsdp) == 2 * hsdp[0]["total_bytes"]  # each replica reads the model once
    fsdp_tp = check_layout(results, "fsdp_tp", ranks_per_copy=4)
    assert any("_StridedShard" in p for p in fsdp_tp[0]["placements"])  # FSDP2 over column-wise TP
    check_layout(results, "pp_fsdp", ranks_per_copy=4)


# ---- the reader on its own ----------------------------------------------------------------------
def test_slices_equal_indexing_and_count_their_bytes(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from titan_core.hf.folder import open_hf_folder

    full = torch.randn(6, 5, 4).to(torch.bfloat16)
    (tmp_path / "config.json").write_text("{}")
    save_file({"w": full, "b": torch.arange(7, dtype=torch.float32)}, str(tmp_path / "model.safetensors"))
    folder = open_hf_folder(tmp_path, what="test")
    rows = torch.tensor([4, 1, 1, 5])
    with folder.reader() as reader:
        part = reader.read("w", rows, [(1, 3), (2, 4)])
        assert torch.equal(part, full[rows][:, 1:3, 2:4])
        assert reader.bytes_read == 3 * 2 * 2 * 2  # rows 1, 4, 5 once each, 2 x 2 bf16 values per row
        assert torch.equal(reader.read("b", torch.tensor([2, 3, 4])), torch.arange(2, 5, dtype=torch.float32))
        assert torch.equal(reader.read("w"), full)
        assert reader.read("w", torch.tensor([0]), [(2, 2), (0, 4)]).shape == (1, 0, 4)
        with pytest.raises(ValueError, match="does not fit shape"):
            reader.read("w", None, [(0, 6), (0, 4)])


def test_a_file_damaged_after_opening_is_one_clear_error(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from titan_core import ConfigError
    from titan_core.hf.folder import open_hf_folder

    (tmp_path / "config.json").write_text("{}")
    file = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(64, 64)}, str(file))
    folder = open_hf_folder(tmp_path, what="test")  # headers checked here
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 100])  # truncated afterwards (an interrupted copy)
    with folder.reader() as reader, pytest.raises(ConfigError, match="places tensor w outside the file.*re-download"):
        reader.read("w")
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    header["w"]["data_offsets"] = [0, 64 * 64 * 4 - 4]  # a range that does not match the shape
    text = json.dumps(header, separators=(",", ":")).encode().ljust(header_len)
    file.write_bytes(data[:8] + text + data[8 + header_len:])
    with folder.reader() as reader, pytest.raises(ConfigError, match="gives tensor w 16380 bytes, not the 16384"):
        reader.read("w")


def test_a_wrong_row_map_is_the_adapters_error() -> None:
    from titan_core import PluginError
    from titan_core.hf.adapter import row_map

    class Bad:
        def from_hf_rows(self, key: str, shape: tuple[int, ...], args: Any) -> torch.Tensor:
            return torch.tensor([0, 9])

    with pytest.raises(PluginError, match=r"Bad.from_hf_rows\('x'\) returned no valid row map"):
        row_map(Bad(), "x", (4, 3), (2, 3), None)

    class Partial:
        def from_hf_rows(self, key: str, shape: tuple[int, ...], args: Any) -> torch.Tensor | None:
            if key == "odd":
                raise NotImplementedError
            return None

    assert row_map(object(), "x", (4, 3), (4, 3), None) is None  # no from_hf_rows: read whole
    assert row_map(Partial(), "odd", (4, 3), (4, 3), None) is None  # not a row gather: read whole
    assert torch.equal(row_map(Partial(), "x", (4, 3), (4, 3), None), torch.arange(4))  # a rename
    with pytest.raises(PluginError, match="says the rows stay in order"):
        row_map(Partial(), "x", (4, 3), (3, 4), None)


def test_titan_plugin_check_catches_a_row_map_that_lies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from titan_core.testing import Target
    from titan_core.testing.checks import SPEC_CHECKS, run_check
    from titan_llama.hf_adapter import LlamaStateDictAdapter

    check = next(c for c in SPEC_CHECKS if c.name == "HF round trip")
    assert run_check(Target("spec", "llama3", workdir=tmp_path), check).status == "pass"
    # Claiming "a plain rename" for q/k, whose rows from_hf permutes, would load wrong weights.
    monkeypatch.setattr(LlamaStateDictAdapter, "from_hf_rows", lambda self, key, shape, args: None)
    result = run_check(Target("spec", "llama3", workdir=tmp_path), check)
    assert result.status == "fail" and "self_attn.q_proj.weight" in result.detail, result
