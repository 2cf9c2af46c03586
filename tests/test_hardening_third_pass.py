"""Hardening, third pass (issue 31, item 5): one row per class of hostile input, each through the real
command's ``main`` in this process: the exit code, the one message, no traceback, nothing left behind.

Classes: numbers a chart cannot draw in metrics.jsonl; titan-generate flags out of torch's range
(seed, device); MoE settings without an upper bound, or given to a dense flavor; --shard-tokens too
small; a FIFO or a dangling link where a folder is expected; a profiling window outside the run; a
checkpoint read with another spec's --config; titan-plugin new with an over-long name or a dangling
--dir; --schema with several specs installed.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
        "--training.local_batch_size=2", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1",
        "--metrics.report=false")
TOOLS = {"train": "titan_train", "report": "report", "generate": "generate", "data": "data_prepare",
         "plugin": "titan_plugin"}


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-step llama3 run with a checkpoint (shared by the rows that read one)."""
    from titan_core.commands.titan_train import main

    run = tmp_path_factory.mktemp("ckpt") / "run"
    assert main([*TINY, f"--job.run_dir={run}", "--training.steps=1", "--checkpoint.enable=true"]) == 0
    return run


def extreme_metrics(tmp: Path) -> None:
    run = tmp / "run"
    run.mkdir()
    good = [json.dumps({"step": s, "loss": 5.0 - s / 10}) for s in range(1, 4)]
    hostile = ['{"step": 4, "loss": ' + "9" * 400 + "}", '{"step": 5, "loss": 1e308, "grad_norm": -1e308}',
               '{"step": ' + "1" * 400 + ', "loss": 1.0}', '{"step": 6, "loss": -1.7976931348623157e308}']
    (run / "metrics.jsonl").write_text("\n".join(good + hostile) + "\n")


def fifo(tmp: Path) -> None:
    os.mkfifo(tmp / "fifo")


def dangling(tmp: Path) -> None:
    (tmp / "dangling").symlink_to(tmp / "nowhere" / "x")


def other_spec_config(tmp: Path) -> None:
    (tmp / "qwen3.toml").write_text('[model]\nspec = "qwen3"\nflavor = "debugmodel"\n')


@dataclass(frozen=True)
class Case:
    name: str
    tool: str
    args: tuple[str, ...]
    code: int
    says: tuple[str, ...]
    setup: Callable[[Path], None] | None = None
    absent: tuple[str, ...] = ()  # paths (under tmp) that must not exist afterwards


CASES = [
    Case("metrics.jsonl: 400-digit integers and +-1e308 (traceback)", "report", ("{tmp}/run",), 0,
         ("report",), extreme_metrics),
    Case("titan-generate --seed 2**70 (traceback)", "generate", ("{tmp}/none", "--prompt", "x", "--seed", str(2**70)),
         2, ("--seed must be a whole number from 0 to 2**63-1",)),
    Case("titan-generate --seed -1", "generate", ("{tmp}/none", "--prompt", "x", "--seed", "-1"),
         2, ("--seed must be a whole number from 0 to 2**63-1",)),
    Case("titan-generate --device meta (traceback)", "generate", ("{tmp}/none", "--prompt", "x", "--device", "meta"),
         2, ("--device meta holds shapes, not values",)),
    Case("titan-generate --device cuda on a torch without CUDA (AssertionError)", "generate",
         ("{tmp}/none", "--prompt", "x", "--device", "cuda"), 2, ("--device cuda: this torch sees no CUDA device",)),
    Case("titan-generate --device banana", "generate", ("{tmp}/none", "--prompt", "x", "--device", "banana"),
         2, ("--device 'banana' is not a torch device",)),
    Case("qwen3.moe_bias_update_rate=5 (no upper bound)", "train",
         ("--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.moe_bias_update_rate=5", "--dry-run"), 2,
         ("qwen3.moe_bias_update_rate", "less than or equal to 1")),
    Case("qwen3.moe_aux_loss_coeff=2 (no upper bound)", "train",
         ("--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.moe_aux_loss_coeff=2", "--dry-run"), 2,
         ("qwen3.moe_aux_loss_coeff", "less than or equal to 1")),
    Case("MoE settings with a dense flavor (silently ignored)", "train",
         ("--spec", "qwen3", "--flavor", "debugmodel", "--qwen3.moe_aux_loss_coeff=0.01",
          "--qwen3.mlp_only_layers=[0]", "--dry-run"), 2,
         ("moe_aux_loss_coeff=0.01, mlp_only_layers=(0,) only act on MoE layers", "Use a MoE flavor")),
    Case("titan-data prepare --shard-tokens 1 (thousands of shards)", "data",
         ("prepare", "builtin", "--tokenizer", "builtin", "--out", "{tmp}/out", "--shard-tokens", "1"), 2,
         ("--shard-tokens 1: at least 512 tokens per shard",), absent=("out",)),
    Case("titan-data prepare --hf-timeout nan", "data",
         ("prepare", "builtin", "--tokenizer", "builtin", "--out", "{tmp}/out", "--hf-timeout", "nan"), 2,
         ("--hf-timeout nan: give the seconds",), absent=("out",)),
    Case("tokens:FIFO (called a folder)", "train", (*TINY, "--data.source=tokens:{tmp}/fifo", "--training.steps=1",
                                                   "--job.run_dir={tmp}/run"), 2,
         ("fifo is a named pipe (FIFO), not a folder",), fifo),
    Case("a FIFO as a mixture source (named data.source)", "train",
         (*TINY, "--data.mix.code.source={tmp}/fifo", "--data.mix.code.weight=1", "--training.steps=1",
          "--job.run_dir={tmp}/run"), 2, ('data.mix.code.source "', "is a named pipe (FIFO)"), fifo),
    Case("titan-report on a FIFO", "report", ("{tmp}/fifo",), 2, ("fifo is a named pipe (FIFO), not a folder",), fifo),
    Case("titan-plugin new with a 300-character name (partial files)", "plugin",
         ("new", "converter", "a" * 300, "--dir", "{tmp}/pkg"), 2,
         ("a converter name of 300 characters is too long: at most 64",), absent=("pkg",)),
    Case("titan-plugin new --dir a dangling link (named --job.run_dir)", "plugin",
         ("new", "converter", "fine", "--dir", "{tmp}/dangling"), 2,
         ("is a symbolic link to", "which does not exist"), dangling, absent=("nowhere",)),
    Case("a checkpoint given another spec's --config (a shape mismatch)", "generate",
         ("{ckpt}", "--prompt", "x", "--config", "{tmp}/qwen3.toml"), 2,
         ("qwen3.toml is the config of a qwen3/debugmodel run", "was saved by spec llama3, flavor debugmodel"),
         other_spec_config),
    Case("a profiling window after the run's last step (no word)", "train",
         (*TINY, "--training.steps=1", "--profiling.enable=true", "--profiling.start_step=5", "--job.run_dir={tmp}/run"),
         0, ("profiling: steps 5..6 (profiling.start_step, profiling.steps) lie after this run's last step 1",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_one_clear_message(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            request: pytest.FixtureRequest) -> None:
    if case.setup is not None:
        case.setup(tmp_path)
    ckpt = str(request.getfixturevalue("checkpointed")) if any("{ckpt}" in a for a in case.args) else ""
    args = [a.replace("{tmp}", str(tmp_path)).replace("{ckpt}", ckpt) for a in case.args]
    main = importlib.import_module(f"titan_core.commands.{TOOLS[case.tool]}").main
    code = main(args)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == case.code, text
    for fragment in case.says:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    assert "Traceback" not in text, text
    for path in case.absent:
        assert not (tmp_path / path).exists(), path
    if case.tool == "report" and case.code == 0:
        assert (tmp_path / "run" / "report.html").stat().st_size > 0


def test_schema_needs_no_spec_and_covers_every_installed_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.titan_train import main

    assert main(["--schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"llama3", "qwen3", "float8", "mx", "training", "model"} <= set(schema["properties"])


def test_generate_on_a_hugging_face_folder_needs_no_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two specs installed: config.json's model_type says which adapter reads the folder (it once asked for a
    --model.spec flag titan-generate does not have)."""
    from titan_core.commands.generate import main as generate
    from titan_core.commands.titan_train import main as train

    monkeypatch.delenv("TITAN_DEFAULT_SPEC", raising=False)
    run = tmp_path / "run"
    assert train([*TINY, f"--job.run_dir={run}", "--training.steps=1", "--checkpoint.enable=true",
                  "--checkpoint.export_at_end=true", "--checkpoint.export_format=hf"]) == 0
    capsys.readouterr()
    assert generate([str(run / "export" / "hf"), "--prompt", "The", "--max-new-tokens", "3"]) == 0
    captured = capsys.readouterr()
    assert "Hugging Face folder, spec llama3" in captured.err, captured.err
    assert captured.out.startswith("The")
