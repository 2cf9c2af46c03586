"""Checkpointing: round trips, resharding across layouts, crash safety, identity checks, export."""

from __future__ import annotations

import copy
import errno
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from titan_core.checkpoint import CheckpointManager, RunIdentity, collect_param_shapes, export_safetensors, integrity
from titan_core.checkpoint.storage import IndexedWriter
from titan_core.config.sections import CheckpointSection
from titan_core.errors import CheckpointError

from _checkpoint_worker import Position, build, train_step
from checkpoint_pause import install as install_pause
from conftest import free_port

WORKER = Path(__file__).with_name("_checkpoint_worker.py")
torch.set_num_threads(1)


def identity_of(model: nn.Module, *, spec: str = "tiny", flavor: str = "debug",
                converters: tuple[str, ...] = ()) -> RunIdentity:
    return RunIdentity(spec, flavor, converters, collect_param_shapes([model]))


class Run:
    """A model, optimizer, scheduler and data position with a manager over them."""

    def __init__(self, run_dir: Path, *, identity: RunIdentity | None = None, parts: list[nn.Module] | None = None,
                 **config: object) -> None:
        self.model, self.optimizer, self.scheduler, self.position = build()
        self.parts = parts or [self.model]
        if parts is not None:
            params = [p for part in parts for p in part.parameters()]
            self.optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0 / (1 + s))
        settings: dict[str, object] = {"enable": True, "interval": 1, "keep_latest_k": 0}
        settings.update(config)
        self.config = CheckpointSection(**settings)  # type: ignore[arg-type]
        self.ckpt = CheckpointManager(
            config=self.config, run_dir=run_dir, model_parts=self.parts, optimizer=self.optimizer,
            lr_schedulers=self.scheduler, dataloader=self.position,
            identity=identity or identity_of(self.model), is_rank0=True,
        )

    def train(self, *steps: int) -> None:
        for step in steps:
            train_step(self.model, self.optimizer, self.scheduler, step)
            self.position.sample = 10 * step


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def flat_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, object]:
    state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def assert_same(a: dict[str, object], b: dict[str, object]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key  # type: ignore[arg-type]
        else:
            assert a[key] == b[key], key


# ---- round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_round_trip_restores_model_optimizer_schedule_data_rng_and_step(tmp_path: Path, async_mode: str) -> None:
    run = Run(tmp_path, async_mode=async_mode)
    assert run.ckpt.resume() is None
    run.train(1, 2)
    random.seed(5)
    np.random.seed(6)
    run.ckpt.maybe_save(2, tokens_seen=2048)
    weights, optim = model_tensors(run.model), flat_optimizer(run.model, run.optimizer)
    lr_state = copy.deepcopy(run.scheduler.state_dict())
    expected_draws = (torch.rand(4), random.random(), np.random.rand())
    run.train(3)  # in async mode this overlaps the background write
    run.ckpt.wait()

    fresh = Run(tmp_path, async_mode=async_mode)
    info = fresh.ckpt.resume()
    assert info is not None
    assert (info.step, info.tokens_seen, info.path.name, info.optimizer_loaded) == (2, 2048, "step-000002", True)
    assert_same(model_tensors(fresh.model), weights)
    assert_same(flat_optimizer(fresh.model, fresh.optimizer), optim)
    assert fresh.scheduler.state_dict() == lr_state and fresh.scheduler.last_epoch == 2
    assert fresh.position.sample == 20
    draws = (torch.rand(4), random.random(), np.random.rand())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1:] == expected_draws[1:]
    # training continues identically from the restored state
    run_ref = Run(tmp_path / "unused", enable=False)
    run_ref.train(1, 2, 3)
    fresh.train(3)
    assert_same(model_tensors(fresh.model), model_tensors(run_ref.model))


def test_async_save_loads_identically_to_sync_save(tmp_path: Path) -> None:
    sync = Run(tmp_path, folder="sync")
    background = Run(tmp_path, folder="async", async_mode="async")
    for run in (sync, background):
        run.train(1, 2)
        run.ckpt.maybe_save(2, tokens_seen=7)
    background.train(3)  # weights change while the async write runs; the save must hold step 2
    background.ckpt.wait()
    loaded = [Run(tmp_path, folder=folder) for folder in ("sync", "async")]
    for run in loaded:
        assert run.ckpt.resume() is not None
    assert_same(model_tensors(loaded[0].model), model_tensors(loaded[1].model))
    assert_same(flat_optimizer(loaded[0].model, loaded[0].optimizer), flat_optimizer(loaded[1].model, loaded[1].optimizer))
    assert_same(model_tensors(loaded[0].model), model_tensors(sync.model))


def test_save_cadence_every_interval_and_at_the_last_step(tmp_path: Path) -> None:
    run = Run(tmp_path, interval=2)
    for step in range(1, 6):
        run.ckpt.maybe_save(step, tokens_seen=step, last=step == 5)
        run.ckpt.maybe_save(step, tokens_seen=step, last=step == 5)  # a second call for a step is a no-op
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000002", "step-000004", "step-000005"]


def test_pipeline_parts_share_one_optimizer_and_reshard_to_one_part(tmp_path: Path) -> None:
    model, _, _, _ = build()
    first, second = copy.deepcopy(model), copy.deepcopy(model)
    # as a pipeline split does: stage 0 keeps layers 0-1, stage 1 keeps layer 2, fqns unchanged
    del first._modules["2"]
    del second._modules["0"], second._modules["1"]
    assert {k for k, _ in first.named_parameters()}.isdisjoint(k for k, _ in second.named_parameters())
    staged = Run(tmp_path, parts=[first, second], identity=identity_of(model))
    x = torch.randn(4, 6)
    second(first(x)).square().mean().backward()
    staged.optimizer.step()
    staged.ckpt.maybe_save(1, tokens_seen=1)
    expected = {**model_tensors(first), **model_tensors(second)}

    whole = Run(tmp_path)
    whole.ckpt.resume()
    assert_same(model_tensors(whole.model), expected)
    exp_avg = whole.optimizer.state[whole.model[2].weight]["exp_avg"]
    assert torch.equal(exp_avg, staged.optimizer.state[second.get_submodule("2").weight]["exp_avg"])

    whole.train(2)
    whole.ckpt.maybe_save(2, tokens_seen=2)
    restaged = Run(tmp_path, parts=[copy.deepcopy(first), copy.deepcopy(second)], identity=identity_of(model))
    restaged.ckpt.resume()
    assert torch.equal(restaged.parts[1].get_submodule("2").weight, whole.model[2].weight)
    assert torch.equal(restaged.optimizer.state[restaged.parts[0].get_submodule("0").bias]["exp_avg_sq"],
                       whole.optimizer.state[whole.model[0].bias]["exp_avg_sq"])


def test_llama_pipeline_stages_with_shared_layer_container_reshard(tmp_path: Path) -> None:
    from titan_llama.model import LlamaArgs, Transformer

    args = LlamaArgs(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=64, multiple_of=16, max_seq_len=16)
    reference = Transformer(args)
    reference.init_weights(seed=1)
    stage0, stage1 = copy.deepcopy(reference), copy.deepcopy(reference)
    stage0.norm, stage0.output = None, None
    del stage0.layers["2"], stage0.layers["3"]
    stage1.tok_embeddings = None
    del stage1.layers["0"], stage1.layers["1"]
    # both stages hold a "layers" container: the merged view must join them
    assert collect_param_shapes([stage0, stage1]) == collect_param_shapes([reference])
    optimizer = torch.optim.AdamW([*stage0.parameters(), *stage1.parameters()], lr=1e-2)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    stage1(stage0(tokens)).logsumexp(-1).mean().backward()
    optimizer.step()

    def manager(parts: list[nn.Module], opt: torch.optim.Optimizer) -> CheckpointManager:
        return CheckpointManager(
            config=CheckpointSection(enable=True, interval=1), run_dir=tmp_path, model_parts=parts, optimizer=opt,
            lr_schedulers=Position(), dataloader=Position(),
            identity=RunIdentity("llama3", "tiny", (), collect_param_shapes([reference])), is_rank0=True)

    manager([stage0, stage1], optimizer).maybe_save(1, tokens_seen=16)
    whole = Transformer(args)
    whole.init_weights(seed=2)
    whole_optimizer = torch.optim.AdamW(whole.parameters(), lr=1e-2)
    assert manager([whole], whole_optimizer).resume() is not None
    assert_same(model_tensors(whole), {**model_tensors(stage0), **model_tensors(stage1)})
    for name, stage in (("layers.3.feed_forward.w2.weight", stage1), ("tok_embeddings.weight", stage0)):
        assert torch.equal(whole_optimizer.state[whole.get_parameter(name)]["exp_avg_sq"],
                           optimizer.state[stage.get_parameter(name)]["exp_avg_sq"]), name


# ---- FSDP2 on two processes ----------------------------------------------------------------



def run_ranks(scenario: str, run_dir: Path, world: int) -> None:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), scenario, str(run_dir)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    for rank, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{out}"


def test_fsdp2_two_ranks_reshard_to_and_from_one_process(tmp_path: Path) -> None:
    single = Run(tmp_path, folder="single")
    single.train(1, 2)
    single.ckpt.maybe_save(2, tokens_seen=2)
    run_ranks("fsdp", tmp_path, world=2)

    # 1 -> 2: the two FSDP2 ranks saw exactly the single-process state
    seen = torch.load(tmp_path / "fsdp_loaded.pt", weights_only=True)
    assert (seen["step"], seen["sample"], seen["last_epoch"]) == (2, 20, 2)
    assert_same(seen["model"], model_tensors(single.model))
    assert_same(seen["optimizer"], flat_optimizer(single.model, single.optimizer))

    # 2 -> 1: the sharded sync (step 3) and async (step 4) saves load into one process
    for folder, step in (("multi", 3), ("multi_async", 4)):
        reference = torch.load(tmp_path / f"fsdp_step{step}.pt", weights_only=True)
        run = Run(tmp_path, folder=folder)
        info = run.ckpt.resume()
        assert info is not None and (info.step, info.tokens_seen) == (step, 100 * step)
        assert run.position.sample == 10 * step and run.scheduler.last_epoch == step
        assert_same(model_tensors(run.model), reference["model"])
        assert_same(flat_optimizer(run.model, run.optimizer), reference["optimizer"])
        shards = sorted(p.name for p in (tmp_path / folder / f"step-{step:06d}").glob("*.distcp"))
        assert shards == ["__0_0.distcp", "__1_0.distcp"]

    # a full disk on rank 1 alone: both ranks report it, nothing was published
    for mode in ("sync", "async"):
        for rank in (0, 1):
            text = (tmp_path / f"fault_{mode}_rank{rank}.txt").read_text()
            assert "No space left on device" in text and ".tmp-step-000006-" in text, (mode, rank, text)
    assert not (tmp_path / "multi" / "step-000006").exists() and not (tmp_path / "multi_async" / "step-000006").exists()
    assert not list((tmp_path / "multi").glob(".tmp-*"))

    # export gathered the FSDP2 shards into one bf16 file
    exported = load_file(str(tmp_path / "export" / "model.safetensors"))
    final = torch.load(tmp_path / "fsdp_step5_model.pt", weights_only=True)
    assert sorted(exported) == sorted(final)
    for key, value in final.items():
        assert exported[key].dtype == torch.bfloat16 and torch.equal(exported[key], value.to(torch.bfloat16))


def test_pipeline_ranks_save_disjoint_stages_and_export_shards(tmp_path: Path) -> None:
    run_ranks("pp", tmp_path, world=2)
    stages = [torch.load(tmp_path / f"pp_rank{r}.pt", weights_only=True) for r in (0, 1)]
    whole = Run(tmp_path, folder="pp")  # one process holding the whole model
    info = whole.ckpt.resume()
    assert info is not None and (info.step, info.tokens_seen) == (1, 5) and whole.position.sample == 11
    assert_same(model_tensors(whole.model), {**stages[0]["model"], **stages[1]["model"]})
    assert_same(flat_optimizer(whole.model, whole.optimizer), {**stages[0]["optimizer"], **stages[1]["optimizer"]})
    # untrained weights moved by exactly one AdamW step: the checkpoint is not the initial state
    assert not torch.equal(whole.model[2].weight, build()[0][2].weight)

    index = json.loads((tmp_path / "pp_export" / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"0.weight": "model-00001-of-00002.safetensors", "0.bias": "model-00001-of-00002.safetensors",
                                   "2.weight": "model-00002-of-00002.safetensors", "2.bias": "model-00002-of-00002.safetensors"}
    exported = {}
    for shard in sorted(set(index["weight_map"].values())):
        exported.update(load_file(str(tmp_path / "pp_export" / shard)))
    assert_same(exported, model_tensors(whole.model))


# ---- discovery, retention, crash safety ---------------------------------------------------


def test_auto_resume_ignores_temporary_and_incomplete_folders(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.train(1, 2)
    run.ckpt.maybe_save(2, tokens_seen=2)
    folder = tmp_path / "checkpoints"
    good = folder / "step-000002"
    stale = folder / ".tmp-step-000009-dead"
    incomplete = folder / "step-000008"
    for broken in (stale, incomplete):
        broken.mkdir()
        for f in good.iterdir():
            (broken / f.name).write_bytes(f.read_bytes())
    (incomplete / "tensor_index.json").unlink()

    fresh = Run(tmp_path)  # rank 0 removes interrupted saves at startup
    assert not stale.exists() and incomplete.exists()
    info = fresh.ckpt.resume()
    assert info is not None and info.path == good and info.step == 2


def test_keep_latest_k_keeps_exactly_k_complete_checkpoints(tmp_path: Path) -> None:
    run = Run(tmp_path, keep_latest_k=2)
    for step in range(1, 5):
        run.train(step)
        run.ckpt.maybe_save(step, tokens_seen=step)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000003", "step-000004"]


def test_keep_latest_k_never_deletes_the_new_checkpoint_nor_an_earlier_runs_newer_one(tmp_path: Path) -> None:
    old = Run(tmp_path, keep_latest_k=1)
    old.ckpt.maybe_save(50, tokens_seen=1)
    again = Run(tmp_path, keep_latest_k=1, resume="never")
    assert again.ckpt.resume() is None
    again.ckpt.maybe_save(10, tokens_seen=1)  # the earlier run's step-50 is not this run's to delete
    again.ckpt.maybe_save(11, tokens_seen=1)  # this run's own step-10 is
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000011", "step-000050"]


def test_sigkill_while_saving_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    pause_file = tmp_path / "paused"  # the worker pauses step 2's save through tests/checkpoint_pause.py
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(WORKER), "pause", str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not pause_file.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the worker never reached the pause"
        time.sleep(0.1)
    tmp = Path(pause_file.read_text())
    assert tmp.name.startswith(".tmp-step-000002-") and (tmp / "tensor_index.json").is_file()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    resumed = Run(tmp_path)
    info = resumed.ckpt.resume()
    assert info is not None and info.step == 1 and info.tokens_seen == 10
    reference = Run(tmp_path / "unused", enable=False)
    reference.train(1)
    assert_same(model_tensors(resumed.model), model_tensors(reference.model))
    assert not tmp.exists()  # cleaned up by the new run


def test_injected_pause_writes_the_pause_file_and_sleeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pause_file = tmp_path / "paused"
    monkeypatch.setattr(integrity, "digest_share", integrity.digest_share)  # undone after the test
    install_pause(at_step=2, pause_file=pause_file, seconds=0.6)
    run = Run(tmp_path)
    run.ckpt.maybe_save(1, tokens_seen=1)
    assert not pause_file.exists()  # only the named step pauses
    start = time.monotonic()
    run.ckpt.maybe_save(2, tokens_seen=2)
    assert time.monotonic() - start >= 0.6
    assert Path(pause_file.read_text()).name.startswith(".tmp-step-000002-")
    assert (tmp_path / "checkpoints" / "step-000002").is_dir()


# ---- failures while saving ---------------------------------------------------------


def test_unwritable_folder_is_a_checkpoint_error_naming_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    run = Run(tmp_path, folder="a_file/checkpoints")
    with pytest.raises(CheckpointError, match=r"cannot create the checkpoint folder .*a_file/checkpoints: .*Not a directory"):
        run.ckpt.maybe_save(1, tokens_seen=1)


@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_disk_full_during_save_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             async_mode: str) -> None:
    run = Run(tmp_path, async_mode=async_mode)
    run.train(1)
    run.ckpt.maybe_save(1, tokens_seen=1)
    run.ckpt.wait()
    weights = model_tensors(run.model)

    def full_disk(self: IndexedWriter, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(IndexedWriter, "write_data", full_disk)
    run.train(2)
    with pytest.raises(CheckpointError) as caught:
        run.ckpt.maybe_save(2, tokens_seen=2)
        run.ckpt.wait()
    text = str(caught.value)
    assert "No space left on device" in text and ".tmp-step-000002-" in text
    assert "previous checkpoint" in text and "step-000001 is intact" in text
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000001"]
    fresh = Run(tmp_path)
    info = fresh.ckpt.resume()
    assert info is not None and info.step == 1
    assert_same(model_tensors(fresh.model), weights)


# ---- identity checks ---------------------------------------------------------------


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    run = Run(tmp_path, identity=identity_of(build()[0], converters=("float8",)))
    run.train(1)
    run.ckpt.maybe_save(1, tokens_seen=1)
    return tmp_path


def test_different_spec_is_refused(saved: Path) -> None:
    run = Run(saved, identity=identity_of(build()[0], spec="other", converters=("float8",)))
    with pytest.raises(CheckpointError, match=r"written by spec 'tiny' but this run uses spec 'other'"):
        run.ckpt.resume()


def test_different_flavor_is_refused(saved: Path) -> None:
    run = Run(saved, identity=identity_of(build()[0], flavor="8B", converters=("float8",)))
    with pytest.raises(CheckpointError, match=r"flavor 'debug' but this run uses flavor '8B'"):
        run.ckpt.resume()


def test_different_converters_are_refused_unless_allowed(saved: Path) -> None:
    run = Run(saved, identity=identity_of(build()[0], converters=("mx",)))
    with pytest.raises(CheckpointError) as caught:
        run.ckpt.resume()
    text = str(caught.value)
    assert "converters ['float8'] but this run uses ['mx']" in text
    assert "--checkpoint.allow_converter_change=true" in text

    allowed = Run(saved, identity=identity_of(build()[0], converters=("mx",)), allow_converter_change=True)
    info = allowed.ckpt.resume()
    assert info is not None and info.step == 1 and not info.optimizer_loaded
    reference = Run(saved / "unused", enable=False)
    reference.train(1)
    assert_same(model_tensors(allowed.model), model_tensors(reference.model))
    assert len(allowed.optimizer.state) == 0  # optimizer state deliberately not loaded


def test_different_parameter_shape_names_the_parameter_and_both_shapes(saved: Path) -> None:
    model, _, _, _ = build()
    shapes = dict(collect_param_shapes([model]))
    shapes["2.weight"] = (4, 10)
    identity = RunIdentity("tiny", "debug", ("float8",), shapes)
    run = Run(saved, identity=identity)
    with pytest.raises(CheckpointError, match=r"parameter '2.weight' has shape \[3, 10\] in the checkpoint but \[4, 10\]"):
        run.ckpt.resume()


# ---- damaged checkpoints -------------------------------------------------------------


def test_resume_from_an_explicit_incomplete_path_names_what_is_missing(saved: Path) -> None:
    target = saved / "checkpoints" / "step-000001"
    (target / "tensor_index.json").unlink()
    run = Run(saved, resume=str(target), identity=identity_of(build()[0], converters=("float8",)))
    with pytest.raises(CheckpointError, match=r"step-000001 is not a complete checkpoint: missing tensor_index\.json"):
        run.ckpt.resume()
    missing = Run(saved, resume=str(saved / "nowhere"))
    with pytest.raises(CheckpointError, match=r"missing the folder .*nowhere itself"):
        missing.ckpt.resume()


@pytest.mark.parametrize(
    ("victim", "damage", "message"),
    [
        ("tensor_index.json", "truncate", r"checkpoint file .*step-000001/tensor_index\.json is \d+ bytes but was"),
        ("__0_0.distcp", "garbage", r"checkpoint file .*step-000001/__0_0\.distcp does not match its recorded CRC-32"),
        ("__0_0.distcp", "truncate", r"checkpoint file .*step-000001/__0_0\.distcp is \d+ bytes but was written with"),
        ("titan_checkpoint.json", "garbage", r"identity file .*step-000001/titan_checkpoint\.json is unreadable"),
    ],
)
def test_corrupt_files_are_named(saved: Path, victim: str, damage: str, message: str) -> None:
    path = saved / "checkpoints" / "step-000001" / victim
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 16]) + data[middle + 16:])
    run = Run(saved, identity=identity_of(build()[0], converters=("float8",)))
    with pytest.raises(CheckpointError, match=message):
        run.ckpt.resume()


def test_a_pickle_added_to_a_checkpoint_is_refused_unread(saved: Path) -> None:
    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {saved / 'pwned'}",))

    (saved / "checkpoints" / "step-000001" / ".metadata").write_bytes(pickle.dumps(Exploit()))
    run = Run(saved, identity=identity_of(build()[0], converters=("float8",)))
    with pytest.raises(CheckpointError, match=r"holds '\.metadata', which its manifest does not list"):
        run.ckpt.resume()
    assert not (saved / "pwned").exists()


# ---- export ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_export_safetensors_matches_the_model_weights(tmp_path: Path, dtype: torch.dtype) -> None:
    run = Run(tmp_path, enable=False)
    run.train(1)
    export_safetensors([run.model], tmp_path / "out" / "model.safetensors", dtype=dtype, is_rank0=True)
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    weights = model_tensors(run.model)
    assert sorted(exported) == sorted(weights)
    for key, value in weights.items():
        assert exported[key].dtype == dtype and torch.equal(exported[key], value.to(dtype))


# ---- the old, pickled format ---------------------------------------------------------------------


def test_old_format_is_refused_and_converts_only_on_explicit_trust(tmp_path: Path) -> None:
    """A checkpoint as titan-core wrote it before (DCP's FileSystemWriter: pickled .metadata, torch.save'd
    entries) is refused by resume, then converted by the explicit command and resumed exactly."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from titan_core.checkpoint import legacy, states

    run = Run(tmp_path / "new")
    run.train(1)
    run.ckpt.maybe_save(1, tokens_seen=10)
    old = tmp_path / "old" / "checkpoints" / "step-000001"
    state = {
        "model": get_model_state_dict(run.model), "optimizer": flat_optimizer(run.model, run.optimizer),
        "lr_scheduler": run.scheduler.state_dict(), "dataloader": run.position.state_dict(),
        "progress": {"step": torch.tensor(1), "tokens_seen": torch.tensor(10)}, "rng": {"rank0": states.rng_state()},
    }
    dcp.save(state, storage_writer=FileSystemWriter(old), no_dist=True)
    record = json.loads((tmp_path / "new" / "checkpoints" / "step-000001" / "titan_checkpoint.json").read_text())
    (old / "titan_checkpoint.json").write_text(json.dumps({**record, "format": 1}))

    refused = Run(tmp_path / "old")
    with pytest.raises(CheckpointError, match=r"tensor index is DCP's pickled \.metadata.*--i-trust-this-checkpoint"):
        refused.ckpt.resume()
    assert legacy.main([str(old), str(tmp_path / "converted" / "step-000001")]) == 2  # no flag, no unpickling
    assert not (tmp_path / "converted").exists()
    assert legacy.main([legacy.TRUST_FLAG, str(old), str(tmp_path / "converted" / "step-000001")]) == 0

    fresh = Run(tmp_path / "converted", folder=".")
    info = fresh.ckpt.resume()
    assert info is not None and (info.step, info.tokens_seen) == (1, 10)
    assert_same(model_tensors(fresh.model), model_tensors(run.model))
    assert_same(flat_optimizer(fresh.model, fresh.optimizer), flat_optimizer(run.model, run.optimizer))
    assert fresh.scheduler.state_dict() == run.scheduler.state_dict() and fresh.position.sample == run.position.sample


# ---- named states; the weights-only writer ----------------------------------------------


def test_named_states_restore_every_state_and_the_old_constructor_reads_the_same_checkpoint(tmp_path: Path) -> None:
    from titan_core.checkpoint import StepCounter, training_states

    config = CheckpointSection(enable=True, interval=1, keep_latest_k=0)
    model, optimizer, scheduler, position = build()
    counter = StepCounter()  # what the Trainer is: the "progress" state
    states = training_states([model], optimizer, lr_schedulers=scheduler, dataloader=position, progress=counter)
    ckpt = CheckpointManager(config=config, run_dir=tmp_path, states=states, identity=identity_of(model), is_rank0=True)
    for step in (1, 2):
        train_step(model, optimizer, scheduler, step)
    position.sample, counter.step, counter.tokens_seen = 20, 2, 2048
    ckpt.maybe_save(2, tokens_seen=2048)
    counter.step = 3  # a progress state that disagrees with the step saved: refused before anything is written
    with pytest.raises(ValueError, match="saving step 4, but states\\['progress'\\] says step 3"):
        ckpt.maybe_save(4, tokens_seen=4096)
    assert sorted(p.name for p in tmp_path.joinpath("checkpoints").iterdir()) == ["step-000002"]

    fresh_model, fresh_opt, fresh_sched, fresh_pos = build()
    fresh_counter = StepCounter()
    fresh = CheckpointManager(config=config, run_dir=tmp_path, identity=identity_of(fresh_model), is_rank0=True,
                              states=training_states([fresh_model], fresh_opt, lr_schedulers=fresh_sched,
                                                     dataloader=fresh_pos, progress=fresh_counter))
    info = fresh.resume()
    assert info is not None and (info.step, info.tokens_seen) == (2, 2048)
    assert (fresh_counter.step, fresh_counter.tokens_seen, fresh_pos.sample) == (2, 2048, 20)
    assert_same(model_tensors(fresh_model), model_tensors(model))
    assert_same(flat_optimizer(fresh_model, fresh_opt), flat_optimizer(model, optimizer))

    old_model, old_opt, old_sched, old_pos = build()
    with pytest.warns(DeprecationWarning, match="deprecated"):
        old = CheckpointManager(config=config, run_dir=tmp_path, model_parts=[old_model], optimizer=old_opt,
                                lr_schedulers=old_sched, dataloader=old_pos, identity=identity_of(old_model),
                                is_rank0=True)
    info = old.resume()
    assert info is not None and (info.step, old_pos.sample) == (2, 20)
    assert_same(model_tensors(old_model), model_tensors(model))


class ExtraState:
    """A named state beyond the training states (like DiLoCo's outer state)."""

    def __init__(self, optional: bool) -> None:
        self.optional_in_checkpoint, self.value, self.loaded = optional, torch.zeros(3), False

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.value.copy_(state_dict["value"])
        self.loaded = True


def test_a_state_marked_optional_is_skipped_when_the_checkpoint_lacks_it_and_loaded_when_it_has_it(
        tmp_path: Path) -> None:
    from titan_core.checkpoint import training_states

    config = CheckpointSection(enable=True, interval=1, keep_latest_k=0)

    def manager(run_dir: Path, extra: ExtraState | None) -> CheckpointManager:
        model, optimizer, scheduler, position = build()
        states = training_states([model], optimizer, lr_schedulers=scheduler, dataloader=position)
        return CheckpointManager(config=config, run_dir=run_dir, identity=identity_of(model), is_rank0=True,
                                 states={**states, **({"extra": extra} if extra else {})})

    manager(tmp_path / "without", None).maybe_save(1, tokens_seen=8)
    skipped = ExtraState(optional=True)
    info = manager(tmp_path / "without", skipped).resume()
    assert info is not None and info.step == 1 and not skipped.loaded  # left as it was
    with pytest.raises(CheckpointError, match="extra.value"):  # a required state the checkpoint lacks
        manager(tmp_path / "without", ExtraState(optional=False)).resume()
    saved = ExtraState(optional=True)
    saved.value.fill_(7.0)
    manager(tmp_path / "with", saved).maybe_save(1, tokens_seen=8)
    loaded = ExtraState(optional=True)
    assert manager(tmp_path / "with", loaded).resume() is not None
    assert loaded.loaded and torch.equal(loaded.value, torch.full((3,), 7.0))


def test_a_weights_only_checkpoint_is_published_with_its_extra_files_in_the_manifest(tmp_path: Path) -> None:
    from titan_core.checkpoint import write_weights_checkpoint
    from titan_core.checkpoint.identity import read_record
    from titan_core.checkpoint.tensor_index import read_index
    from titan_core.weights.titan_checkpoint import load_model_weights

    model = build()[0]
    shape = b'{"hidden_size": 10}'
    path = write_weights_checkpoint(tmp_path, [model], identity=identity_of(model),
                                    extra_files={"hf_config.json": shape})
    assert path == tmp_path / "step-000000" and sorted(p.name for p in tmp_path.iterdir()) == ["step-000000"]
    record = read_record(path)
    assert "hf_config.json" in record.files and (path / "hf_config.json").read_bytes() == shape
    integrity.check_listing(path, record.files)  # the folder holds exactly its manifest's files
    assert integrity.verify_share(path, record.files, rank=0, world=1) is None
    # the weights, the step and the manager's own RNG streams: no optimizer, schedule or data position
    assert {key.split(".")[0] for key in read_index(path, record.files).tensors} == {"model", "progress", "rng"}
    fresh = build()[0]
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    assert load_model_weights(path, [fresh]) == 0
    assert_same(model_tensors(fresh), model_tensors(model))
    with pytest.raises(ValueError, match="extra file 'titan_checkpoint.json'"):
        write_weights_checkpoint(tmp_path / "x", [model], identity=identity_of(model),
                                 extra_files={"titan_checkpoint.json": b"{}"})
