"""Rehearsal of a pipelined cluster layout with a checkpoint save: one rank of FSDP8 x TP8 x PP2 at 128 ranks
trains here under the fake process group (train/rehearsal.py; static stage shapes in parallel/pipeline.py; the
checkpoint manager's ``lone_rank``)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import run_cli

LAYOUT = ("--nnodes", "16", "--nproc-per-node", "8", "--parallelism.dp_shard=8", "--parallelism.tp=8",
          "--parallelism.pp=2")


@pytest.mark.parametrize("rank", [0, 127])
def test_one_rank_of_fsdp8_tp8_pp2_at_128_ranks_trains_3_steps_and_saves_its_shards(tmp_path, rank: int) -> None:
    run_dir = tmp_path / "run"
    r = run_cli("--spec", "llama3", *LAYOUT, "--rehearse-rank", str(rank), "--training.steps=3",
                "--training.seq_len=64", "--training.local_batch_size=2", "--metrics.log_freq=1",
                "--checkpoint.enable=true", "--checkpoint.interval=3", f"--job.run_dir={run_dir}",
                "--metrics.report=false")
    assert r.code == 0, r.text
    assert f"rehearsal: rank {rank} of 128 under torch's fake process group" in r.text
    assert "finite checks are off" in r.text
    assert [int(n) for n in re.findall(r"^step +(\d+) \|", r.text, re.M)] == [1, 2, 3], r.text
    assert re.search(rf"rehearsal done: 3 steps on rank {rank} of 128, peak memory [\d.]+ GiB", r.text), r.text

    saved = run_dir / "checkpoints" / "step-000003"
    own = f"__{rank}_0.distcp"
    assert sorted(p.name for p in saved.iterdir()) == sorted([own, "tensor_index.json", "titan_checkpoint.json"])
    assert f"holds rank {rank}'s shards only ({own}); the other 127 ranks' files do not exist" in r.text
    record = json.loads((saved / "titan_checkpoint.json").read_text())
    assert record["step"] == 3 and record["world_size"] == 128, record
    index = json.loads((saved / "tensor_index.json").read_text())
    files = {chunk["file"] for entry in index["tensors"].values() for chunk in entry["chunks"]}
    assert files == {own}
    # the stage's own blocks only: PP2 of the debug model's 6 layers puts layers 0-2 on rank 0, 3-5 on the last
    layers = {int(m.group(1)) for key in index["tensors"] if (m := re.search(r"model\.layers\.(\d+)\.", key))}
    assert layers == ({0, 1, 2} if rank == 0 else {3, 4, 5}), sorted(layers)
