"""Fault tolerance with torchft: replica groups that survive a lost group (real processes, gloo).

The local supervisor starts a lighthouse and K groups; the tests SIGKILL a group or the
lighthouse and check exit codes, the [ft] lines, and that every group ends bit-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ft_helpers import (
    absent_windows,
    committed_losses,
    finished_after_kills,
    kill_at,
    rejoin_seconds,
    start,
    steps_logged,
    wait_line,
    wait_step,
)

pytest.importorskip("torchft")

from titan_core.commands import report as report_cli  # noqa: E402
from titan_core.config.job import JobConfig  # noqa: E402
from titan_core.observability.report.svg import COLORS  # noqa: E402


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_section_checks_replica_ids_and_follows_the_supervisor() -> None:
    cfg = JobConfig.model_validate({"fault_tolerance": {"local_replicas": 3}}, context={"world_size": 1})
    assert cfg.fault_tolerance.group_size == 3
    with pytest.raises(ValueError, match="replica_id=2 is outside 0..1"):
        JobConfig.model_validate({"fault_tolerance": {"group_size": 2, "replica_id": 2}}, context={"world_size": 1})
    with pytest.raises(ValueError, match="min_replicas=3 is more than group_size=2"):
        JobConfig.model_validate({"fault_tolerance": {"group_size": 2, "min_replicas": 3}}, context={"world_size": 1})


# The bound on a restarted group's rejoin (process start, imports, model build, state transfer).
REJOIN_S = 15.0
# Test-only (fault_tolerance/rehearsal.py): while a group is down each step waits this long, so the survivors
# cannot finish the run before the restarted group is back, and leave it the CPU (groups share 2 cores here).
def hold(seconds: float) -> dict[str, str]:
    return {"TITAN_FT_TEST_SHORT_STEP_S": str(seconds)}


def test_killed_groups_rejoin_and_lose_nothing_but_their_own_batches(tmp_path: Path) -> None:
    # Replica 1 is killed and restarted in the supervisor's spare process (imports done): back within REJOIN_S.
    # Then replica 2 is killed with the spare, so its restart is a fresh process (slow here) and the survivors
    # train steps without it. A reference run in which the groups sit out the same steps must match bit for bit.
    run, log = tmp_path / "run", tmp_path / "failed.log"
    args = ("--fault_tolerance.local_replicas=3", "--llama3.n_layers=2", "--training.steps=40")
    sup = start(run, *args, "--checkpoint.export_at_end=true", log=log, env_extra=hold(1))
    kill_at(sup, run, 1, 6)
    wait_line(log, "replica 1 rejoined from replica", sup)
    spare = int((run / "spare.pid").read_text())  # the next spare, started at the rejoin
    kill_at(sup, run, 2, max(r["step"] for r in steps_logged(run / "replica_0")) + 1)
    os.kill(spare, signal.SIGKILL)
    out, ft = finished_after_kills(sup, log, 1, 2)
    for i in (1, 2):  # the survivors never restarted
        assert any(f"replica {i} left (SIGKILL); 2 of 3 replicas training" in line for line in ft), ft
    rejoined = [line for line in ft if " rejoined from replica" in line]
    assert len(rejoined) == 2 and all(line.endswith("3 of 3 replicas training") for line in rejoined), ft
    assert rejoin_seconds(out)[0] <= REJOIN_S, rejoined  # the restart in the spare
    # Every group holds the same bytes at the end.
    exports = [run / f"replica_{i}" / "export" / "model.safetensors" for i in range(3)]
    assert len({digest(p) for p in exports}) == 1
    # Every committed step has one loss, whichever groups committed it; restarted groups resumed at their
    # peer's step, not at step 1.
    failed = committed_losses(run, 3)
    assert sorted(failed) == list(range(1, 41)) and all(len(v) == 1 for v in failed.values()), failed
    # A restarted group keeps the records of its earlier life (committed steps nobody trains again) and logs again
    # from the step it rejoined at: nothing moved aside, no claim that anything was redone.
    events = [json.loads(line) for line in (run / "ft_events.jsonl").read_text().splitlines()]
    rejoined_at = {e["replica"]: e["step"] for e in events if e["event"] == "rejoined"}
    last_before = {e["replica"]: e["last_logged_step"] for e in events if e["event"] == "died"}
    assert [r["step"] for r in steps_logged(run / "replica_2")] == [
        *range(1, last_before[2] + 1), *range(rejoined_at[2], 41)]
    assert not list(run.glob("replica_*/metrics.superseded.jsonl")) and "redoes" not in out
    # titan-report on the run folder: one report, every group's curve, each left/rejoin mark at the step of the
    # supervisor's [ft] line, one line per failure.
    assert report_cli.main([str(run)]) == 0
    html = (run / "report.html").read_text()
    loss = re.search(r'<svg class="chart" data-metric="loss".*?</svg>', html, re.S).group(0)  # type: ignore[union-attr]
    assert {c for c in re.findall(r'<polyline fill="none" stroke="(#[0-9A-F]+)"', loss)} == set(COLORS[:3])
    said = [(kind, int(step)) for step, kind in re.findall(r"\[ft\] step (\d+): replica \d (left|rejoined)", out)]
    drawn = [(kind.removeprefix("ft-"), int(step)) for kind, step in re.findall(r'data-kind="(ft-[a-z]+)" data-step="(\d+)"', loss)]
    assert sorted(drawn) == sorted(said) and len(said) == 4, (said, drawn)
    survivor = {int(r["step"]): r["ft_replicas"] for r in steps_logged(run / "replica_0")}
    left_at = {e["replica"]: e["step"] for e in events if e["event"] == "left"}
    for i in (1, 2):  # the left mark is the first step committed without the group, the rejoin mark its first step back
        assert survivor[left_at[i]] == 2 or left_at[i] == rejoined_at[i], (i, left_at, survivor)
        assert {int(r["step"]): r["ft_replicas"] for r in steps_logged(run / f"replica_{i}")}[rejoined_at[i]] == 3
    for i in (1, 2):
        assert re.search(rf'<li class="ft-event">replica {i} died \(SIGKILL\) after step {last_before[i]} .*?rejoined at '
                         rf'step {rejoined_at[i]} from replica \d', html), html
    # The reference: an unfailed run in which the groups sat out the same steps (test-only hook) commits the
    # same losses, bit for bit: fault tolerance lost nothing but the lost groups' batches.
    # Usually the fresh restart of replica 2 takes steps that the survivors commit without it; when a
    # group is back before any step commits without it (a quiet machine), there is nothing to sit out,
    # and the failed run must then equal the unfailed one exactly.
    absent = absent_windows(run, 3)
    print(f"windows sat out: {absent or 'none'}")
    ref = start(tmp_path / "ref", *args, log=tmp_path / "ref.log", env_extra={"TITAN_FT_TEST_ABSENT": absent})
    ref.wait(timeout=300)
    assert ref.returncode == 0, (tmp_path / "ref.log").read_text()[-3000:]
    assert committed_losses(tmp_path / "ref", 3) == failed


def test_two_groups_of_two_fsdp2_ranks_killed_one_after_the_other(tmp_path: Path) -> None:
    # Each group is `--nproc-per-node 2` with context parallelism inside: the 2 ranks split every sequence, and
    # FSDP2 shards the weights over them (dp_shard_cp), so a rejoining group's ranks receive their peer ranks'
    # shards. Replica 1 is lost (launcher and workers, as a lost node), rejoins, then replica 0 is lost.
    run, log = tmp_path / "run", tmp_path / "sup.log"
    sup = start(run, "--fault_tolerance.local_replicas=2", "--nproc-per-node", "2", "--llama3.n_layers=2",
                "--parallelism.cp=2",
                "--training.seq_len=32", "--training.steps=40", "--checkpoint.export_at_end=true", log=log,
                env_extra=hold(3))  # a restart here is 3 processes importing torch: ~30 s on a loaded machine
    kill_at(sup, run, 1, 4)
    wait_line(log, "replica 1 rejoined from replica 0", sup)
    kill_at(sup, run, 0, max(r["step"] for r in steps_logged(run / "replica_0")) + 2)
    out, ft = finished_after_kills(sup, log, 1, 0)
    assert [line.split(": ", 1)[1] for line in ft if " rejoined " in line] == [
        f"replica {i} rejoined from replica {1 - i} ({s:.1f}s after its restart); 2 of 2 replicas training"
        for i, s in zip((1, 0), rejoin_seconds(out))], ft
    exports = [run / f"replica_{i}" / "export" / "model.safetensors" for i in range(2)]
    assert digest(exports[0]) == digest(exports[1])
    committed = committed_losses(run, 2)
    assert sorted(committed) == list(range(1, 41)) and all(len(v) == 1 for v in committed.values()), committed
    # Each group sat out some steps, and every step trained by one group is explained by who was down.
    assert absent_windows(run, 2).count(":") == 2


def test_lost_lighthouse_stops_the_groups_with_one_message_then_they_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ("--fault_tolerance.local_replicas=2", "--llama3.n_layers=2", "--training.seq_len=32",
            "--training.steps=400", "--fault_tolerance.quorum_timeout_s=5", "--checkpoint.enable=true",
            "--checkpoint.interval=2")
    sup = start(run, *args)
    wait_step(run / "replica_0", 4)
    lighthouse = int((run / "lighthouse.pid").read_text())
    os.kill(lighthouse, signal.SIGKILL)
    killed = time.monotonic()
    out, _ = sup.communicate(timeout=120)
    assert time.monotonic() - killed < 5 + 10
    assert sup.returncode == 5, out[-3000:]
    assert out.count("the lighthouse died") == 1 and "Traceback" not in out, out[-3000:]
    assert "no quorum" not in out  # the groups' own messages are left to the supervisor
    again = start(run, *args[:-4], "--training.steps=6", "--checkpoint.enable=true", "--checkpoint.interval=2")
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-3000:]
    assert "[replica 0] [titan] resuming from" in out and "[replica 1] [titan] resuming from" in out


def test_replica_with_another_config_is_refused_with_one_message(tmp_path: Path) -> None:
    from titan_core.fault_tolerance.supervisor import _free_port, lighthouse_program

    port = _free_port()
    lighthouse = subprocess.Popen([lighthouse_program(), "--min_replicas", "1", "--bind", f"[::]:{port}",
                                   "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "1000"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    common = ("--fault_tolerance.enable=true", "--fault_tolerance.group_size=2", "--llama3.n_layers=2",
              "--training.seq_len=32", f"--fault_tolerance.lighthouse=http://127.0.0.1:{port}", "--training.steps=2000")
    good = start(tmp_path / "r0", *common, "--fault_tolerance.replica_id=0", log=tmp_path / "r0.log")
    try:
        wait_step(tmp_path / "r0", 2)
        bad = start(tmp_path / "r1", *common, "--fault_tolerance.replica_id=1", "--training.seed=7")
        out, _ = bad.communicate(timeout=120)
        assert bad.returncode == 2, out[-3000:]
        errors = [line for line in out.splitlines() if "titan-train: error" in line]
        assert len(errors) == 1 and "replica 1 refused" in errors[0] and "training.seed is 7 here but 0 in replica 0" \
            in errors[0], out[-3000:]
        assert good.poll() is None  # the live group kept training
    finally:
        good.kill()
        good.communicate()
        lighthouse.kill()
        lighthouse.wait()



# The DiLoCo bar: 200 steps of 2 groups on the built-in corpus, validation loss within 2% of synchronous
# training's (benchmarks/diloco.py measures the same on a 2-layer model; docs/fault-tolerance.md).
DILOCO_RUN = ("--fault_tolerance.local_replicas=2", "--llama3.n_layers=1", "--training.seq_len=32",
              "--training.steps=200", "--lr_scheduler.warmup_steps=20", "--validation.enable=true",
              "--validation.freq=200", "--validation.steps=8")
CKPT_198 = ("--checkpoint.enable=true", "--checkpoint.interval=198", "--checkpoint.keep_latest_k=0",
            "--checkpoint.export_at_end=true")
DILOCO = "--fault_tolerance.semi_sync=diloco"


def validation_loss(run: Path) -> float:
    """The mean over the groups of their last validation loss (each scores its share of the held-out batches)."""
    losses = []
    for i in range(2):
        records = [json.loads(line) for line in (run / f"replica_{i}" / "metrics.jsonl").read_text().splitlines()]
        losses.append([r["val_loss"] for r in records if "val_loss" in r][-1])
    return sum(losses) / 2


def finish(run: Path, *args: str) -> None:
    log = run.parent / f"{run.name}.log"
    proc = start(run, *args, log=log)
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]


def test_diloco_is_within_2_percent_of_synchronous_training_and_resumes_exactly(tmp_path: Path) -> None:
    finish(tmp_path / "sync", *DILOCO_RUN, *CKPT_198)
    finish(tmp_path / "diloco", *DILOCO_RUN, *CKPT_198, DILOCO)
    sync, diloco = validation_loss(tmp_path / "sync"), validation_loss(tmp_path / "diloco")
    assert diloco / sync <= 1.02, (sync, diloco)
    losses = [{int(r["step"]): r["loss"] for r in steps_logged(tmp_path / "diloco" / f"replica_{i}")} for i in range(2)]
    assert sorted(losses[0]) == sorted(losses[1]) == list(range(1, 201)) and losses[0] != losses[1]  # own data
    exports = [tmp_path / "diloco" / f"replica_{i}" / "export" / "model.safetensors" for i in range(2)]
    assert digest(exports[0]) == digest(exports[1])  # step 200 is a sync step: the same weights again

    # Stopped at step 198, between two syncs (the outer step at 200 needs the last-sync weights of step 195, which
    # only the checkpoint's DiLoCo state holds), each group resumes its own checkpoint: the same losses and weights.
    resumed = back_to_198(tmp_path / "diloco", tmp_path / "resumed")
    finish(resumed, *DILOCO_RUN, *CKPT_198, DILOCO)
    for i in range(2):
        again = {int(r["step"]): r["loss"] for r in steps_logged(resumed / f"replica_{i}")}
        assert sorted(again) == list(range(1, 201))
        assert [again[s] for s in (199, 200)] == pytest.approx([losses[i][s] for s in (199, 200)], rel=1e-6), i
        assert digest(resumed / f"replica_{i}" / "export" / "model.safetensors") == digest(exports[0]), i

    # A DiLoCo checkpoint resumes a plain run (its weights and optimizer; the outer state is not needed), and a
    # synchronous run's checkpoint resumes DiLoCo (the outer state then starts from the checkpoint's weights).
    [at198] = (tmp_path / "diloco" / "replica_0" / "checkpoints").glob("step-*198")
    finish(tmp_path / "plain", "--llama3.n_layers=1", "--training.seq_len=32", "--training.steps=200",
           "--training.local_batch_size=8", f"--checkpoint.resume={at198}", "--checkpoint.enable=true")
    assert [int(r["step"]) for r in steps_logged(tmp_path / "plain")] == [199, 200]
    from_sync = back_to_198(tmp_path / "sync", tmp_path / "from-sync")
    finish(from_sync, *DILOCO_RUN, *CKPT_198, DILOCO)
    for i in range(2):
        assert [int(r["step"]) for r in steps_logged(from_sync / f"replica_{i}")][-3:] == [198, 199, 200]
    exports = [from_sync / f"replica_{i}" / "export" / "model.safetensors" for i in range(2)]
    assert digest(exports[0]) == digest(exports[1])  # the sync at step 200 took the outer step from step 198


def back_to_198(run: Path, copy: Path) -> Path:
    """A copy of ``run`` as it was after step 198: its checkpoints of step 200 and its exports removed."""
    shutil.copytree(run, copy)
    for i in range(2):
        shutil.rmtree(copy / f"replica_{i}" / "export")
        for later in (copy / f"replica_{i}" / "checkpoints").glob("step-*"):
            if int(later.name.split("-")[1]) > 198:
                shutil.rmtree(later)
    return copy


def test_checkpoints_cross_between_plain_and_fault_tolerant_runs(tmp_path: Path) -> None:
    # A plain run's checkpoint resumes 2 groups, and group 0's checkpoint resumes a plain run; each
    # continues the plain run's curve (the same windows per step: 2 groups x 4 sequences = 8 in one process;
    # the same training.steps, which shapes the LR schedule).
    ckpt = ("--llama3.n_layers=2", "--training.seq_len=32", "--checkpoint.enable=true", "--checkpoint.interval=4",
            "--checkpoint.keep_latest_k=0")
    plain = start(tmp_path / "plain", *ckpt, "--training.local_batch_size=8", "--training.steps=10",
                  log=tmp_path / "plain.log")
    assert plain.wait(timeout=300) == 0, (tmp_path / "plain.log").read_text()[-3000:]
    reference = {int(r["step"]): r["loss"] for r in steps_logged(tmp_path / "plain")}
    [at4] = sorted((tmp_path / "plain" / "checkpoints").glob("step-*4"))
    ft = start(tmp_path / "ft", *ckpt, "--fault_tolerance.local_replicas=2", "--training.steps=10",
               f"--checkpoint.resume={at4}", log=tmp_path / "ft.log")
    assert ft.wait(timeout=300) == 0, (tmp_path / "ft.log").read_text()[-3000:]
    for i in range(2):
        losses = {int(r["step"]): r["loss"] for r in steps_logged(tmp_path / "ft" / f"replica_{i}")}
        assert sorted(losses) == [5, 6, 7, 8, 9, 10]
        assert all(losses[s] == pytest.approx(reference[s], rel=1e-4) for s in losses), (losses, reference)
    [at8] = sorted((tmp_path / "ft" / "replica_0" / "checkpoints").glob("step-*8"))
    back = start(tmp_path / "back", *ckpt, "--training.local_batch_size=8", "--training.steps=10",
                 f"--checkpoint.resume={at8}", log=tmp_path / "back.log")
    assert back.wait(timeout=300) == 0, (tmp_path / "back.log").read_text()[-3000:]
    losses = {int(r["step"]): r["loss"] for r in steps_logged(tmp_path / "back")}
    assert sorted(losses) == [9, 10] and all(losses[s] == pytest.approx(reference[s], rel=1e-4) for s in losses), \
        (losses, reference)


@pytest.mark.parametrize("name,value", [
    ("TITAN_FT_TEST_ABSENT", "1:11"), ("TITAN_FT_TEST_ABSENT", "x:1-2"), ("TITAN_FT_TEST_ABSENT", "1:9-3"),
    ("TITAN_FT_TEST_ABSENT", "1:0-3"), ("TITAN_FT_TEST_ABSENT", "1:1-99999999999999"),
    ("TITAN_FT_TEST_SHORT_STEP_S", "soon"), ("TITAN_FT_TEST_SHORT_STEP_S", "nan"),
    ("TITAN_FT_TEST_SHORT_STEP_S", "inf"), ("TITAN_FT_TEST_SHORT_STEP_S", "-1"),
])
def test_the_test_only_variables_refuse_garbage_with_one_message(name: str, value: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core.errors import ConfigError
    from titan_core.fault_tolerance.rehearsal import absent_windows as read_absent, short_step_seconds

    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}=.*test-only variable must be unset in real runs"):
        read_absent() if name.endswith("ABSENT") else short_step_seconds()


def test_diloco_outer_state_in_a_checkpoint_is_checked_before_use() -> None:
    # What a resume hands OuterState (the checkpoint's "diloco" entry) is untrusted: each bad value is one message.
    import torch

    from titan_core.errors import CheckpointError
    from titan_core.fault_tolerance.diloco import OuterState, OuterStep

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    outer = OuterStep([model], lr=1.4, momentum=0.5, sync_steps=5)
    good = {k: v.clone() for k, v in OuterState(outer).state_dict().items()}
    assert sorted(good) == ["anchor.bias", "anchor.weight", "momentum.bias", "momentum.weight", "sync_steps", "synced_at"]
    saved = {**good, "anchor.weight": torch.full((2, 3), 0.25), "momentum.bias": torch.ones(2), "synced_at": torch.tensor(195)}
    fresh = OuterStep([torch.nn.Linear(3, 2)], lr=1.4, momentum=0.5, sync_steps=5)
    OuterState(fresh).load_state_dict(saved)
    assert torch.equal(fresh.anchor[0], torch.full((2, 3), 0.25)) and fresh.synced_at == 195 and fresh.loaded
    assert torch.equal(fresh.optimizer.state[fresh.anchor[1]]["momentum_buffer"], torch.ones(2))
    fresh.restart_from_model(0)  # a loaded anchor is kept at the first step
    assert torch.equal(fresh.anchor[0], torch.full((2, 3), 0.25))
    bad = [({"anchor.weight": torch.zeros(3, 2)}, r"diloco.anchor.weight is torch.float32\[3, 2\], expected torch.float32\[2, 3\]"),
           ({"anchor.weight": torch.zeros(2, 3, dtype=torch.float64)}, "diloco.anchor.weight is torch.float64"),
           ({"momentum.bias": "rm -rf"}, "diloco.momentum.bias is str"),
           ({"anchor.bias": torch.tensor([1.0, float("nan")])}, "diloco.anchor.bias holds NaN or inf"),
           ({"sync_steps": torch.tensor(3)}, r"sync_steps=3, this run has 5; resume with --fault_tolerance.sync_steps=3"),
           ({"synced_at": torch.tensor(-4)}, "DiLoCo state is damaged"),
           ({"sync_steps": torch.tensor(1.5)}, "diloco.sync_steps is torch.float32")]
    for change, message in bad:
        with pytest.raises(CheckpointError, match=message):
            OuterState(OuterStep([torch.nn.Linear(3, 2)], lr=1.4, momentum=0.5, sync_steps=5)).load_state_dict(
                {**good, **change})
    missing = dict(good)
    del missing["momentum.weight"]
    with pytest.raises(CheckpointError, match="diloco.momentum.weight is NoneType"):
        OuterState(outer).load_state_dict(missing)
