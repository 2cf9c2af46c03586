"""Nobody leaves the rendezvous before everyone has finished it, and a peer that went away is not a timeout.

A rank whose side of gloo's connection mesh is done could run ahead, stop on an error
every rank hits (a missing data file) and close its sockets while a peer is still in
``connectFullMesh``; that peer then reported "rendezvous gave up after 300 s" beside the
real error (seen once in CI). The real 2-process test holds rank 0 back right after its
own ``init_process_group`` and checks rank 1 waited for it; the unit tests check the
message a peer that closed its connection gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

WORKER = '''
import os, sys, time
import torch.distributed as dist
from titan_core.runtime.rendezvous import join_process_group

real_init = dist.init_process_group
HOLD_S = 1.5


def slow_rank0_init(*args, **kwargs):
    real_init(*args, **kwargs)
    if os.environ["RANK"] == "0":  # rank 0 is still "in" its set-up for a while after its mesh is up
        time.sleep(HOLD_S)
        print(f"init_done {time.time():.3f}", flush=True)


dist.init_process_group = slow_rank0_init
join_process_group("gloo", init_timeout_s=60, collective_timeout_s=60)
print(f"left {time.time():.3f}", flush=True)
os._exit(0)  # no destroy_process_group: leave as a rank stopping on its own error would
'''


@pytest.mark.fast
def test_a_rank_leaves_the_rendezvous_only_after_every_rank_has_set_up(tmp_path: Path) -> None:
    import torch.distributed as dist

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # the launcher's store
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    procs = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    stamps = [dict(line.split() for line in out.splitlines() if line.split()[:1] in (["left"], ["init_done"]))
              for out in outputs]
    rank0_done, rank1_left = float(stamps[0]["init_done"]), float(stamps[1]["left"])
    assert rank1_left >= rank0_done, (f"rank 1 left the rendezvous {rank0_done - rank1_left:.3f} s before rank 0 "
                                      f"had finished setting up", outputs)


GLOO_PEER_CLOSED = ("Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
                    "pair.cc:553] Connection closed by peer [127.0.0.1]:6827. This is typically caused by a remote "
                    "worker crashing.")


@pytest.mark.fast
@pytest.mark.parametrize("under_launcher", [True, False], ids=["launcher", "torchrun"])
def test_a_peer_that_closed_mid_set_up_is_a_lost_peer_not_a_timeout(monkeypatch: pytest.MonkeyPatch,
                                                                    under_launcher: bool) -> None:
    from titan_core.errors import PEER_LOST_EXIT, PeerLost
    from titan_core.runtime import rendezvous
    from titan_core.runtime.launch_env import LAUNCHER_ENV

    if under_launcher:
        monkeypatch.setenv(LAUNCHER_ENV, "12345")
    else:
        monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    error = rendezvous._group_setup_failed(RuntimeError(GLOO_PEER_CLOSED), rank=0, world_size=2,
                                           where="127.0.0.1:41919", waited_s=0.4, init_timeout_s=300)
    assert isinstance(error, PeerLost) and error.exit_code == PEER_LOST_EXIT == 4
    assert error.quiet is under_launcher  # the launcher prints the other process's own error instead
    text = str(error)
    assert text.startswith("rendezvous failed after 0.4 s: another process closed its connection while the "
                           "process group was being set up at 127.0.0.1:41919 (rank 0 of WORLD_SIZE=2; Gloo "
                           "connectFullMesh failed"), text
    assert "look for its message" in text and "300" not in text and "timeout" not in text, text


@pytest.mark.fast
def test_a_set_up_that_timed_out_still_says_how_long_it_waited() -> None:
    from titan_core.errors import RendezvousError
    from titan_core.runtime import rendezvous

    error = rendezvous._group_setup_failed(RuntimeError("Timed out waiting 300000ms for recv operation"), rank=1,
                                           world_size=2, where="10.0.0.1:29500", waited_s=300.2, init_timeout_s=300)
    assert type(error) is RendezvousError
    assert str(error).startswith("rendezvous gave up after 300 s (parallelism.init_timeout_s=300): not every one "
                                 "of the 2 processes joined the process group at 10.0.0.1:29500 (Timed out"), error

