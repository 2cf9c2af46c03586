"""Converters end to end through the real CLI: numerics against fp32, overlaps, FSDP2/TP, hooks, errors, a wheel.

Every training here is a subprocess of ``python -m titan_core`` (what ``titan-train``
runs); the error and dry-run cases that need no training call the CLI's ``main``
in this process, which is the same code after process start. Shapes are small
(2 layers of debugmodel, dim 256, 64 tokens) so the whole file stays quick on CPU.
"""

from __future__ import annotations

import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from conftest import REPO, CliResult, Wheels, assert_user_error, run_cli

SMALL = ["--llama3.n_layers=2", "--training.seq_len=64", "--metrics.log_freq=1"]
#: The 14 block linears of 2-layer debugmodel; the output head is filtered by default.
ATTENTION = [f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")]
FEED_FORWARD = [f"layers.{i}.feed_forward.{w}" for i in range(2) for w in ("w1", "w2", "w3")]

#: Per-step |converted - fp32| / fp32 over 20 steps. Measured: float8 (tensorwise, emulated)
#: 0.068% (step 18), mx (mxfp8_rceil, emulated) 0.033%; the bound leaves ~3.5x headroom.
BASELINE_TOLERANCE = 2.5e-3
#: FSDP2 (2 ranks) vs one process with the same micro-batches (gradient accumulation):
#: steps 1-2 match exactly; later float8's rounding amplifies the float32 reduction-order
#: noise: at most 5.8e-6 relative over 6 steps (1.8e-5 over 10, measured). Bound: 1e-4.
FSDP_TOLERANCE = 1e-4


def losses_of(run_dir: Path) -> list[float]:
    """The per-step losses rank 0 recorded (log_freq=1)."""
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> tuple[CliResult, list[float]]:
    result = run_cli(*SMALL, f"--job.run_dir={run_dir}", *args, env=env)
    assert result.code == 0, result.text
    return result, losses_of(run_dir)


def train_concurrently(runs: dict[str, tuple[Path, list[str]]]) -> dict[str, tuple[CliResult, list[float]]]:
    """Independent trainings side by side (each is its own process), to keep the file's wall time down."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(train, run_dir, *args) for name, (run_dir, args) in runs.items()}
        return {name: future.result() for name, future in futures.items()}


def max_relative_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """20-step single-process losses: fp32 baseline, float8 and mx (same seed, data, schedule)."""
    root = tmp_path_factory.mktemp("single")
    common = ["--training.steps=20", "--training.local_batch_size=4"]
    runs = {"baseline": [], "float8": ["--converters", "float8"], "mx": ["--converters", "mx"]}
    done = train_concurrently({name: (root / name, [*common, *args]) for name, args in runs.items()})
    return {name: losses for name, (_, losses) in done.items()}


# --- numerics ------------------------------------------------------------------------------


@pytest.mark.parametrize("converter", ["float8", "mx"])
def test_emulated_training_tracks_the_fp32_baseline(single: dict[str, list[float]], converter: str) -> None:
    converted, baseline = single[converter], single["baseline"]
    assert len(converted) == 20 and all(math.isfinite(x) for x in converted)
    assert converted[-1] < converted[0] - 0.5  # it learns
    gap = max_relative_gap(converted, baseline)
    assert 0 < gap < BASELINE_TOLERANCE, (gap, converted, baseline)  # 0 would mean nothing was converted


def test_fsdp2_float8_matches_one_process_and_says_why_all_gather_is_off(tmp_path: Path) -> None:
    # Same micro-batches on both sides: 2 ranks x 2 sequences, or 1 process x 2 micro-steps of 2.
    # (Tensorwise float8 scales each micro-batch by its own amax, so one process with a batch
    # of 4 would legitimately differ from two ranks with 2 each.)
    common = ["--converters", "float8", "--training.steps=6", "--training.local_batch_size=2"]
    done = train_concurrently({
        "fsdp": (tmp_path / "fsdp", [*common, "--nproc-per-node", "2", "--parallelism.dp_shard=2"]),
        "ref": (tmp_path / "ref", [*common, "--training.global_batch_size=4"]),
    })
    (dist, fsdp), (_, ref) = done["fsdp"], done["ref"]
    assert max_relative_gap(fsdp[:2], ref[:2]) < 1e-6, (fsdp, ref)
    assert max_relative_gap(fsdp, ref) < FSDP_TOLERANCE, (fsdp, ref)
    assert "FSDP float8 all-gather is off: gloo cannot all-gather float8 dtypes" in dist.err, dist.text


def test_mx_trains_under_fsdp2(tmp_path: Path) -> None:
    _, losses = train(tmp_path, "--converters", "mx", "--training.steps=6", "--training.local_batch_size=2",
                      "--nproc-per-node", "2", "--parallelism.dp_shard=2")
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1, losses


def test_float8_rowwise_under_tensor_parallel_matches_one_process(tmp_path: Path) -> None:
    # TP ranks share one batch, so one process with the same batch is the reference. Measured gap
    # over 4 steps: none. Float8 operands have 4 significant bits, so the partial sums of the
    # row-sharded layers are nearly always exact in fp32 and their order hardly matters; plain
    # fp32 TP differs from one process by ~1e-7.
    common = ["--converters", "float8", "--float8.recipe=rowwise", "--training.steps=4", "--training.local_batch_size=4"]
    done = train_concurrently({
        "tp": (tmp_path / "tp", [*common, "--nproc-per-node", "2", "--parallelism.tp=2"]),
        "ref": (tmp_path / "ref", common),
    })
    (dist, tp), (_, ref) = done["tp"], done["ref"]
    assert len(tp) == 4 and all(math.isfinite(x) for x in tp), tp
    assert max_relative_gap(tp, ref) < 1e-5, (tp, ref)
    assert "Float8Linear" in dist.out
    # the weights really are sharded over tp: attention q/k/v and feed-forward w1/w3 by rows
    # (Shard(0)), wo and w2 by columns (Shard(1)); rowwise float8 uses torch's own TP styles
    assert "parameters: 12 x tp:S(0); 5 x tp:R; 4 x tp:S(1); tensor-parallel styles ColwiseParallel / " \
           "RowwiseParallel" in dist.err, dist.err


# --- selection and overlaps ------------------------------------------------------------------


def test_float8_and_mx_defaults_split_the_blocks(tmp_path: Path) -> None:
    result, _ = train(tmp_path, "--converters", "float8,mx", "--training.steps=2", "--training.local_batch_size=4",
                      "--metrics.conversion_table=full")
    rows = json.loads((tmp_path / "conversion_table.json").read_text())
    owner = {row["module"]: row["converter"] for row in rows}
    assert len(owner) == len(rows)  # each module once: the selections are disjoint
    assert sorted(m for m, c in owner.items() if c == "float8") == sorted(ATTENTION)
    assert sorted(m for m, c in owner.items() if c == "mx") == sorted(FEED_FORWARD)
    assert "module" in result.out and "converter" in result.out
    for row in rows:
        assert any(line.split()[:2] == [row["module"], row["converter"]] for line in result.out.splitlines()), row


def printed_owners(text: str) -> dict[str, str]:
    """module -> converter from the printed conversion table."""
    return {parts[0]: parts[1] for parts in (line.split() for line in text.splitlines())
            if len(parts) >= 4 and parts[0].startswith("layers.")}


def test_mx_then_float8_leaves_mx_empty(cli) -> None:
    # float8's default selection is every block linear, so named later it takes the feed-forward too.
    result = cli(*SMALL, "--converters", "mx,float8", "--dry-run")
    assert_user_error(result, 'converter "mx" was requested but has no module left', 'taken by "float8"',
                      "mx.fqns / mx.filter_fqns", "float8.fqns / float8.filter_fqns")


def test_explicit_overlap_later_wins(cli, tmp_path: Path) -> None:
    both = ("--mx.fqns=feed_forward", "--float8.fqns=feed_forward.w1")
    owners = printed_owners(cli(*SMALL, f"--job.run_dir={tmp_path}", "--converters", "mx,float8", *both,
                                "--dry-run").out)
    assert {m: c for m, c in owners.items()} == {
        **{m: "float8" for m in FEED_FORWARD if m.endswith("w1")},
        **{m: "mx" for m in FEED_FORWARD if not m.endswith("w1")},
    }
    # Named the other way round, mx (later) takes w1 too, and float8 is left with nothing.
    result = cli(*SMALL, "--converters", "float8,mx", "--float8.fqns=feed_forward.w1", "--mx.fqns=feed_forward",
                 "--dry-run")
    assert_user_error(result, 'converter "float8" was requested but has no module left', 'taken by "mx"',
                      "layers.0.feed_forward.w1")


def test_dry_run_prints_the_table_and_writes_it_beside_any_earlier_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    earlier = run_dir / "conversion_table.json"  # an earlier run's table: a dry run must not touch it
    earlier.write_text('{"earlier": true}\n')
    result = run_cli(*SMALL, f"--job.run_dir={run_dir}", "--converters", "float8,mx", "--dry-run")
    assert result.code == 0, result.text
    owners = printed_owners(result.out)
    assert sorted(owners) == sorted(ATTENTION + FEED_FORWARD)
    assert "dry run: configuration valid; nothing trained" in result.out
    written = run_dir / "dry-run" / "conversion_table.json"
    assert f"conversion table written to {written}" in result.out
    rows = json.loads(written.read_text())
    assert {r["module"]: r["converter"] for r in rows} == owners
    assert earlier.read_text() == '{"earlier": true}\n'
    # nothing else: no config.toml, no metrics, no checkpoints
    assert sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")) == [
        "conversion_table.json", "dry-run", "dry-run/conversion_table.json"]


# --- optimizer hooks -----------------------------------------------------------------------------

COUNTING_MODULE = '''\
"""A converter registered in-process that records each optimizer hook call in a file."""
import os

from titan_core import ModelConverter, register_model_converter


def _record(what: str) -> None:
    with open(os.environ["HOOK_LOG"], "a") as f:
        f.write(what + "\\n")


class CountingConverter(ModelConverter):
    def select(self, model):
        return ["output"]

    def convert(self, model, fqns):
        pass  # leaves the module as it is: only the hooks matter here

    def pre_optimizer_hook(self, model_parts):
        _record("pre")

    def post_optimizer_hook(self, model_parts):
        _record("post")


register_model_converter("counting", CountingConverter)
'''


@pytest.mark.parametrize("accumulation", [1, 2])
def test_optimizer_hooks_run_once_per_step(tmp_path: Path, accumulation: int) -> None:
    (tmp_path / "counting_converter.py").write_text(COUNTING_MODULE)
    log = tmp_path / "hooks.log"
    env = {"PYTHONPATH": str(tmp_path), "HOOK_LOG": str(log)}
    _, losses = train(tmp_path / "run", "--import", "counting_converter", "--converters", "counting",
                      "--training.steps=5", "--training.local_batch_size=2",
                      f"--training.global_batch_size={2 * accumulation}", env=env)
    assert len(losses) == 5
    assert log.read_text().split() == ["pre", "post"] * 5


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args, fragments", [
    (["--float8.recipe=fastest"], ["float8.recipe", "'tensorwise', 'rowwise' or 'rowwise_with_gw_hp'", "fastest"]),
    (["--float8.recpie=rowwise"], ['unknown key "float8.recpie"', 'Did you mean "recipe"?']),
    (["--float8.fqns=feed_fwd"], ["float8.fqns entries ['feed_fwd'] match no nn.Linear", "Fix float8.fqns"]),
])
def test_bad_float8_settings_are_clear_errors(cli, args: list[str], fragments: list[str]) -> None:
    assert_user_error(cli(*SMALL, "--converters", "float8", *args, "--dry-run"), *fragments)


def test_misspelt_converter_name(cli) -> None:
    assert_user_error(cli(*SMALL, "--converters", "flaot8", "--dry-run"),
                      'unknown converter "flaot8"', 'Did you mean "float8"?', "titan-train --list")


def test_misspelt_key_in_a_real_process() -> None:
    assert_user_error(run_cli(*SMALL, "--converters", "mx", "--mx.fqn=feed_forward", "--dry-run"),
                      'unknown key "mx.fqn"', 'Did you mean "fqns"?')


def test_float8_on_a_too_old_cuda_gpu(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    # The dry run picks CUDA when torch says it is there, and the converter then asks the GPU's capability.
    # The faked GPU's free memory is unknown, so the model-fits check (which asks CUDA) is skipped.
    from titan_core.train import memory_estimate
    from titan_float8 import hardware

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory_estimate, "available_bytes", lambda device, *, local_ranks: None)
    monkeypatch.setattr(hardware, "cuda_capability", lambda device: (8, 0))
    assert_user_error(cli(*SMALL, "--converters", "float8", "--dry-run"),
                      "compute capability 8.9 or newer", "this GPU has compute capability 8.0 (sm_80)",
                      "--float8.emulate=true")


@pytest.mark.parametrize("converter, module, fragment", [
    ("float8", "torchao.float8", "the float8 converter needs torchao: pip install 'torchao>=0.18'"),
    ("mx", "torchao.prototype.moe_training.config", "the mx converter needs torchao's MX training prototype"),
])
def test_converter_without_torchao(cli, monkeypatch: pytest.MonkeyPatch, converter: str, module: str,
                                   fragment: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` raise ImportError
    assert_user_error(cli(*SMALL, "--converters", converter, "--dry-run"), fragment)


# --- a third-party converter from a wheel -------------------------------------------------------------


def test_int8_example_from_its_wheel(tmp_path: Path, wheels: Wheels) -> None:
    env = {"PYTHONPATH": str(wheels.site(REPO / "examples" / "titan-int8-fake"))}

    listed = run_cli("--list", env=env)
    assert listed.code == 0, listed.text
    (line,) = [text for text in listed.out.splitlines() if text.split()[:1] == ["int8fake"]]
    assert line.split()[1:3] == ["titan-int8-fake", "0.1.0"], line

    result, losses = train(tmp_path / "run", "--converters", "int8fake", "--training.steps=8",
                           "--training.local_batch_size=4", env=env)
    rows = json.loads((tmp_path / "run" / "conversion_table.json").read_text())
    assert {row["after"] for row in rows} == {"Int8FakeQuantLinear"}
    assert sorted(row["module"] for row in rows) == sorted(ATTENTION + FEED_FORWARD)
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.1, losses
