"""Garbage in the settings this wave added ([stability] qk_clip_threshold, metrics.layer_stats,
llama3.attention_kernel's new value, parallelism.etp, parallelism.cp and cp_load_balance): exit 2, one
message naming the key, no traceback, and a run folder that already holds a file is left exactly as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_main

CASES = [
    ("--stability.qk_clip_threshold=-1", "stability.qk_clip_threshold"),
    ("--stability.qk_clip_threshold=abc", "stability.qk_clip_threshold"),
    ("--stability.qk_clip_threshold=nan", "stability.qk_clip_threshold = nan"),
    ("--stability.qk_clip_threshold=inf", "stability.qk_clip_threshold = inf"),
    ("--metrics.layer_stats=maybe", "metrics.layer_stats"),
    ("--llama3.attention_kernel=bogus", "llama3.attention_kernel"),
    ("--parallelism.etp=abc", "parallelism.etp"),
    ("--parallelism.etp=0", "parallelism.etp"),
    ("--parallelism.etp=2", "parallelism.etp=2 with parallelism.tp=1"),
    ("--parallelism.cp=abc", "parallelism.cp"),
    ("--parallelism.cp=0", "parallelism.cp"),
    ("--parallelism.cp=2", "cp=2 x tp=1 x pp=1 = 2 does not divide world size 1"),
    ("--parallelism.cp_load_balance=maybe", "parallelism.cp_load_balance"),
    ("--parallelism.pp_static_shapes=maybe", "parallelism.pp_static_shapes"),
    ("--parallelism.pp_static_shapes=2", "parallelism.pp_static_shapes"),
]


@pytest.mark.parametrize(("flag", "named"), CASES, ids=[flag.split("=", 1)[0][2:] + "=" + flag.split("=", 1)[1]
                                                         for flag, _ in CASES])
def test_garbage_is_one_message_and_touches_nothing(flag: str, named: str, tmp_path: Path, capsys) -> None:
    _refused_and_untouched("llama3", flag, named, tmp_path, capsys)


def _refused_and_untouched(spec: str, flag: str, named: str, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    kept = run / "notes.txt"
    kept.write_text("mine")
    result = run_main(capsys, "--spec", spec, "--training.steps=1", f"--job.run_dir={run}", flag)
    assert result.code == 2, result.out + result.err
    assert named in result.err, result.err
    assert "Traceback" not in result.out + result.err
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"] and kept.read_text() == "mine"


DEEPSEEK_CASES = [
    ("--deepseek_v3.mtp_layers=2", "deepseek_v3.mtp_layers"),
    ("--deepseek_v3.mtp_layers=-1", "deepseek_v3.mtp_layers"),
    ("--deepseek_v3.mtp_layers=yes", "deepseek_v3.mtp_layers"),
    ("--deepseek_v3.mtp_loss_weight=nan", "deepseek_v3.mtp_loss_weight = nan"),
    ("--deepseek_v3.mtp_loss_weight=-0.5", "deepseek_v3.mtp_loss_weight"),
]


@pytest.mark.parametrize(("flag", "named"), DEEPSEEK_CASES, ids=[flag[2:] for flag, _ in DEEPSEEK_CASES])
def test_multi_token_prediction_garbage_is_one_message_and_touches_nothing(flag: str, named: str, tmp_path: Path,
                                                                           capsys) -> None:
    _refused_and_untouched("deepseek_v3", flag, named, tmp_path, capsys)
