"""The benchmark scripts run and print their tables (at tiny sizes: the figures themselves come
from full runs, recorded in docs/benchmarks.md; nothing here is timed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO


def bench(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], capture_output=True,
                            text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_overhead_prints_both_loops_their_ratio_and_cpu_mfu() -> None:
    out = bench("overhead.py", "--seq-len", "64", "--batch", "2", "--warmup", "1", "--steps", "2",
                "--rounds", "1", "--matmul-sizes", "256,512")
    rows = {m.group(1): [float(x) for x in m.group(2, 3, 4, 5, 6)]
            for m in re.finditer(r"^(trainer|hand loop)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                                 out, re.M)}
    assert set(rows) == {"trainer", "hand loop"}, out
    for step_s, tokens_per_s, rss_gib, mfu, mfu_full in rows.values():
        # causal attention counted as computed: below the full-square figure, and at most the host's peak
        assert step_s > 0 and rss_gib > 0 and 0 < mfu <= mfu_full and mfu <= 1
        assert abs(tokens_per_s - 2 * 64 / step_s) <= 0.01 * tokens_per_s + 1  # tokens/s is batch x seq / step
    ratio = float(re.search(r"step-time ratio trainer / hand loop: ([\d.]+)", out).group(1))
    # the ratio is of the unrounded times; the printed times have 3 decimals
    assert ratio == pytest.approx(rows["trainer"][0] / rows["hand loop"][0], rel=0.01), out
    assert re.search(r"fp32 matmul reference \(best of 256\^3, 512\^3 x thread settings\): [\d.]+ GFLOP/s "
                     r"at (256|512)\^3, \d+ threads", out), out


def test_attention_prints_fused_against_sdpa_for_each_head_shape() -> None:
    out = bench("attention.py", "--batch", "1", "--seq-len", "64", "--repeats", "1")
    assert "fused fwd ms" in out and "sdpa fwd ms" in out, out
    rows = re.findall(r"^(\d+) x (\d+)((?:\s+[\d.]+){7})$", out, re.M)
    assert [(int(h), int(d)) for h, d, _ in rows] == [(16, 16), (8, 32), (4, 64)], out
    assert all(float(x) > 0 for *_, numbers in rows for x in numbers.split()), out


def test_moe_step_time_prints_both_models_and_their_ratio() -> None:
    out = bench("moe_step_time.py", "--seq-len", "16", "--batch", "2", "--warmup", "1", "--steps", "1")
    rows = {m.group(1): (int(m.group(2).replace(",", "")), int(m.group(3).replace(",", "")))
            for m in re.finditer(r"^(dense \(debugmodel\)|MoE \(debugmoe\))\s+([\d,]+)\s+([\d,]+)\s+[\d.]+\s+[\d.]+$", out, re.M)}
    assert set(rows) == {"dense (debugmodel)", "MoE (debugmoe)"}, out
    dense, moe = rows["dense (debugmodel)"], rows["MoE (debugmoe)"]
    assert moe[0] > 2 * dense[0] and abs(moe[1] - dense[1]) < 0.01 * dense[1]  # same active parameters
    assert re.search(r"^MoE / dense step time: [\d.]+x \(wall clock: [\d.]+x\)$", out, re.M), out


def test_moe_balance_prints_start_peak_and_last_steps() -> None:
    out = bench("moe_balance.py", "--steps", "3", "--", "--qwen3.n_layers=1", "--training.seq_len=16",
                "--training.local_batch_size=2")
    figures = dict(re.findall(r"^  (step 1|peak|last 20 mean):\s+([\d.]+) \[[\d.]+\]", out, re.M))
    assert set(figures) == {"step 1", "peak", "last 20 mean"}, out
    assert all(float(v) >= 1.0 for v in figures.values()) and float(figures["peak"]) >= float(figures["step 1"])
    assert re.search(r"^target <= 1.3: (met|MISSED)$", out, re.M), out


def test_data_prepare_benchmark_prints_tokenizer_and_worker_rates() -> None:
    out = bench("data.py", "prepare", "--mb", "0.3", "--rounds", "1")
    rates = dict(re.findall(r"^(tokenizer alone, 1 core|prepare --workers [12])\s+([\d,]+)\s+[\d.]+$", out, re.M))
    assert set(rates) == {"tokenizer alone, 1 core", "prepare --workers 1", "prepare --workers 2"}, out
    assert all(int(r.replace(",", "")) > 0 for r in rates.values())
    assert re.search(r"^2 workers / 1 worker(?: \(best of each\))?: [\d.]+x$", out, re.M), out


def test_chunked_loss_memory_prints_both_variants_and_their_ratio() -> None:
    out = bench("chunked_loss_memory.py", "--vocab", "3000", "--batch", "2", "--seq-len", "512", "--dim", "32",
                "--chunk-tokens", "64")
    rows = dict(re.findall(r"^(full|chunked)\s+\d+\s+[\d.]+\s+([\d.]+)$", out, re.M))
    assert set(rows) == {"full", "chunked"}, out
    assert abs(float(rows["full"]) - float(rows["chunked"])) < 1e-5, out  # the same loss
    assert re.search(r"chunked / full: peak memory [\d.]+, time [\d.]+, loss difference [\d.e+-]+$", out, re.M), out
