"""A Trainer subclass runs through titan-train (docs/custom-trainer.md, as written), and a bad one is
one message and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_user_error
from doc_commands import blocks, run_blocks

# The flags of the page's run, which the in-process runs below repeat without --trainer.
FLAGS = ["--spec", "llama3", "--llama3.n_layers=2", "--training.steps=2", "--training.seq_len=64",
         "--training.local_batch_size=4", "--metrics.log_freq=1"]


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "loss" in r]


def test_a_subclass_replaces_one_method_from_the_command_line_and_from_main(tmp_path: Path) -> None:
    """The page's commands as written (its DoubledLoss through --trainer, a bad --trainer), then the
    plain Trainer and a class given to ``titan_core.main`` in this process, with the same flags."""
    import torch

    from titan_core import Trainer, main

    pairs = blocks("custom-trainer.md")
    assert len(pairs) == 3
    run_blocks(pairs, tmp_path)
    assert "--trainer" in pairs[1][0] and "DoubledLoss" in pairs[1][0]

    class Halved(Trainer):  # defined here: fine in this process (workers could not import it)
        def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return super().compute_loss(logits, labels) / 2

    assert main([*FLAGS, f"--job.run_dir={tmp_path / 'plain'}"]) == 0
    assert main([*FLAGS, f"--job.run_dir={tmp_path / 'halved'}"], trainer_class=Halved) == 0
    plain, doubled, halved = (_losses(tmp_path / name) for name in ("plain", "runs/doubled", "halved"))
    assert len(plain) == len(doubled) == len(halved) == 2
    # step 1: the same weights and batch, one method replaced; step 2: AdamW moved (nearly) alike
    assert doubled[0] == pytest.approx(2 * plain[0], rel=1e-6)
    assert halved[0] == pytest.approx(plain[0] / 2, rel=1e-6)
    assert doubled[1] == pytest.approx(2 * plain[1], rel=1e-2)


@pytest.mark.parametrize(("ref", "fragments"), [
    ("no_such_module_here:T", ("--trainer no_such_module_here:T", "could not be imported", "PYTHONPATH")),
    ("json:JSONDecoder", ("the class JSONDecoder is not a subclass of titan_core.Trainer",)),
    ("json:nope", ("the module json has no nope",)),
    ("json.JSONDecoder", ("give MODULE:CLASS",)),
])
def test_a_bad_trainer_is_one_message_and_exit_2(cli, ref: str, fragments: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    assert_user_error(cli("--trainer", ref, "--spec", "llama3", "--dry-run"), *fragments)


def test_a_class_given_to_main_reaches_the_workers_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core import Trainer, main
    from titan_core.commands.titan_train import _worker_argv, build_parser

    class Local(Trainer):
        pass

    args = build_parser().parse_known_args([])[0]
    assert _worker_argv(args, ["--x"], Trainer) == ["--x", "--trainer", "titan_core.train.trainer:Trainer"]
    with pytest.raises(Exception, match="worker processes cannot import it"):
        _worker_argv(args, [], Local)
    capsys.readouterr()
    assert main(["--spec", "llama3", "--dry-run"], trainer_class=dict) == 2  # type: ignore[arg-type]
    assert "main(trainer_class=...): the class dict is not a subclass of titan_core.Trainer" in capsys.readouterr().err
