"""A resume on other data than the checkpoint's is refused, naming the change (data/identity.py,
checkpoint/identity.py): a file swapped for one with as many windows, other mixture weights, a
mixture source dropped. ``--checkpoint.allow_data_change=true`` resumes anyway and says what changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from titan_core.checkpoint.identity import describe_data_change

from conftest import assert_user_error

COMMON = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=16",
          "--training.local_batch_size=2", "--metrics.log_freq=1", "--metrics.report=false",
          "--checkpoint.enable=true", "--checkpoint.interval=2", "--data.val_fraction=0")


def pages(path: Path, changed_page: int | None = None) -> Path:
    """60 documents; ``changed_page`` gets other words of the same shape (the same token count)."""
    with path.open("w") as f:
        for i in range(60):
            word = "theta" if i == changed_page else "beta"
            f.write(json.dumps({"text": f"page {i}: alpha {word} gamma delta " * 4}) + "\n")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, Path]:
    return {"a": pages(tmp_path / "a.jsonl"), "b": pages(tmp_path / "b.jsonl"),
            "swapped": pages(tmp_path / "swapped.jsonl", changed_page=7)}


def test_a_source_swapped_for_one_with_as_many_windows_is_refused_or_allowed_with_a_line(
        tmp_path: Path, corpus: dict[str, Path], cli) -> None:
    run = f"--job.run_dir={tmp_path / 'run'}"
    first = cli(*COMMON, run, f"--data.source={corpus['a']}", "--training.steps=2")
    assert first.code == 0, first.text
    # The same bytes at another path are the same data: the resume goes on.
    (tmp_path / "copy.jsonl").write_bytes(corpus["a"].read_bytes())
    same = cli(*COMMON, run, f"--data.source={tmp_path / 'copy.jsonl'}", "--training.steps=3")
    assert same.code == 0 and "resuming from" in same.text, same.text
    # One word of one page differs ("beta" and "theta" are 2 tokens each): as many windows, other tokens.
    from titan_core.plan.tokenizer import build_tokenizer

    tokenizer = build_tokenizer("builtin")
    assert [len(tokenizer.encode(p.read_text())) for p in (corpus["a"], corpus["swapped"])] == \
        [len(tokenizer.encode(corpus["a"].read_text()))] * 2
    refused = cli(*COMMON, run, f"--data.source={corpus['swapped']}", "--training.steps=4")
    assert_user_error(refused, "was trained on other data: data.source", "holds other tokens than it did",
                      "--checkpoint.allow_data_change=true", "--checkpoint.initial_load=")
    allowed = cli(*COMMON, run, f"--data.source={corpus['swapped']}", "--training.steps=4",
                  "--checkpoint.allow_data_change=true")
    assert allowed.code == 0, allowed.text
    assert "on changed data (checkpoint.allow_data_change=true): data.source" in allowed.text


def test_other_mixture_weights_and_a_dropped_source_are_refused(tmp_path: Path, corpus: dict[str, Path], cli) -> None:
    run = f"--job.run_dir={tmp_path / 'run'}"
    mix = (f"--data.mix.a.source={corpus['a']}", f"--data.mix.b.source={corpus['b']}")
    first = cli(*COMMON, run, *mix, "--data.mix.a.weight=0.75", "--data.mix.b.weight=0.25", "--training.steps=2")
    assert first.code == 0, first.text
    weights = cli(*COMMON, run, *mix, "--data.mix.a.weight=0.5", "--data.mix.b.weight=0.5", "--training.steps=4")
    assert_user_error(weights, "data.mix.a had a share of 0.75 of the rows, 0.5 now",
                      "data.mix.b had a share of 0.25 of the rows, 0.5 now")
    dropped = cli(*COMMON, run, mix[0], "--data.mix.a.weight=1", "--training.steps=4")
    assert_user_error(dropped, "data.mix.b is not in this run's data", "data.mix.a had a share of 0.75")


def test_a_checkpoint_without_a_data_record_is_not_compared() -> None:
    now = {"data.source": {"source": "builtin", "weight": 1.0, "fingerprint": "00ff"}}
    assert describe_data_change(None, now) is None and describe_data_change(now, None) is None
    assert describe_data_change(now, json.loads(json.dumps(now))) is None
