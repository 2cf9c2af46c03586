"""A Trainer subclass runs through titan-train (docs/custom-trainer.md, as written), and a bad one is
one message and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_user_error
from doc_commands import blocks, run_blocks


def _losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "loss" in r]


def test_the_pages_subclass_doubles_the_loss(tmp_path: Path) -> None:
    pairs = blocks("custom-trainer.md")
    assert len(pairs) == 3
    run_blocks(pairs, tmp_path)
    plain, doubled = _losses(tmp_path / "runs/plain"), _losses(tmp_path / "runs/doubled")
    assert len(plain) == len(doubled) == 2
    # step 1: the same weights and batch, the one method replaced; step 2: AdamW moved (nearly) alike
    assert doubled[0] == pytest.approx(2 * plain[0], rel=1e-6)
    assert doubled[1] == pytest.approx(2 * plain[1], rel=1e-2)


@pytest.mark.parametrize(("ref", "fragments"), [
    ("no_such_module_here:T", ("--trainer no_such_module_here:T", "could not be imported", "PYTHONPATH")),
    ("json:JSONDecoder", ("the class JSONDecoder is not a subclass of titan_core.Trainer",)),
    ("json:nope", ("the module json has no nope",)),
    ("json.JSONDecoder", ("give MODULE:CLASS",)),
])
def test_a_bad_trainer_is_one_message_and_exit_2(cli, ref: str, fragments: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    assert_user_error(cli("--trainer", ref, "--spec", "llama3", "--dry-run"), *fragments)


def test_main_takes_the_class_and_passes_it_to_workers_by_name(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from titan_core import Trainer, main
    from titan_core.cli import _worker_argv, build_parser

    from conftest import SMALL_RUN, trained

    class Halved(Trainer):  # defined here: fine in this process, not importable by workers
        def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            return super().compute_loss(logits, labels) / 2

    args = build_parser().parse_known_args([])[0]
    assert _worker_argv(args, ["--x"], Trainer) == ["--x", "--trainer", "titan_core.trainer:Trainer"]
    with pytest.raises(Exception, match="worker processes cannot import it"):
        _worker_argv(args, [], Halved)

    flags = [f"--{pair}" for pair in (*SMALL_RUN, "training.steps=1")]
    assert main([*flags, f"--job.run_dir={tmp_path / 'halved'}"], trainer_class=Halved) == 0
    _, plain = trained(tmp_path / "plain", "training.steps=1")
    assert _losses(tmp_path / "halved") == [pytest.approx(plain[0] / 2, rel=1e-6)]

    capsys.readouterr()
    assert main(["--spec", "llama3", "--dry-run"], trainer_class=dict) == 2  # type: ignore[arg-type]
    assert "main(trainer_class=...): the class dict is not a subclass of titan_core.Trainer" in capsys.readouterr().err
