"""The async save's own gloo group connects on demand: no socket mesh over every rank at creation.

Real 4-process run (torchrun, gloo). Each rank counts its open sockets before and after
``open_background_group()`` and again after the collectives an async save makes (DCP's
gather/scatter, an all-gather, a broadcast), and checks the values those returned. An eager
gloo group opens a socket to every peer at creation (3 here, 1023 at 1024 ranks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

WORKER = '''
import json, os, sys
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from titan_core.checkpoint.background_group import LAZY_GLOO_ENV, open_background_group


def sockets():
    names = (os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))
    return sum(1 for name in names if name.startswith("socket:"))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
eager_before = sockets()
eager = dist.new_group(backend="gloo")  # how the group was opened before: the comparison
before = sockets()
group = open_background_group()
at_creation = sockets() - before
state = {"shared": torch.full((4,), 1.0), f"rank{rank}": torch.full((2,), float(rank))}
dcp.async_save(state, checkpoint_id=sys.argv[1], process_group=group).result()
gathered = [None] * world
dist.all_gather_object(gathered, rank, group=group)
box = [f"from {rank}"]
dist.broadcast_object_list(box, src=0, group=group)
record = {"rank": rank, "eager": before - eager_before, "at_creation": at_creation, "after": sockets() - before,
          "gathered": gathered, "broadcast": box[0], "env_left": os.environ.get(LAZY_GLOO_ENV)}
# a file per rank: the ranks' prints share torchrun's stdout, where two lines can land on one
with open(os.path.join(sys.argv[2], f"record{rank}.json"), "w") as out:
    out.write(json.dumps(record))
dist.barrier()
dist.destroy_process_group()
'''


def test_the_background_group_opens_connections_only_when_a_collective_needs_them(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_GLOO_LAZY_INIT", "WORLD_SIZE", "RANK")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", str(script),
                           str(tmp_path / "ckpt"), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = sorted((json.loads(f.read_text()) for f in tmp_path.glob("record*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == [0, 1, 2, 3], proc.stdout
    for r in records:
        assert r["eager"] >= 3, r  # an eager group: a socket to each of the 3 peers at creation
        assert r["at_creation"] <= 1, r  # on demand: at most the store's connection
        assert r["gathered"] == [0, 1, 2, 3] and r["broadcast"] == "from 0", r
        assert r["env_left"] is None, r  # the setting was for this group only
    assert records[0]["after"] >= 3  # the coordinator talked to everyone
    # the save itself is whole: every rank's tensor is in it
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata
    assert sorted(saved) == ["rank0", "rank1", "rank2", "rank3", "shared"], saved
