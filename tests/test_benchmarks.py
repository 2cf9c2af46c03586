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


def test_overhead_prints_both_loops_their_ratio_and_cpu_mfu_against_both_yardsticks() -> None:
    out = bench("overhead.py", "--seq-len", "64", "--batch", "2", "--warmup", "1", "--steps", "2",
                "--rounds", "1", "--matmul-sizes", "256,512")
    rows = {m.group(1): [float(x) for x in m.group(*range(2, 10))]
            for m in re.finditer(r"^(trainer|hand loop)" + r"\s+([\d.]+)" * 8 + "$", out, re.M)}
    assert set(rows) == {"trainer", "hand loop"}, out
    for step_s, tokens_per_s, rss_gib, model_gflops, mfu, mfu_full, vs_peak, vs_peak_full in rows.values():
        # causal attention counted as computed: below the full-square figure against either yardstick
        assert step_s > 0 and rss_gib > 0 and model_gflops > 0 and 0 < mfu <= mfu_full and 0 < vs_peak <= vs_peak_full < 1
        assert abs(tokens_per_s - 2 * 64 / step_s) <= 0.01 * tokens_per_s + 1  # tokens/s is batch x seq / step
    ratio = float(re.search(r"step-time ratio trainer / hand loop: ([\d.]+)", out).group(1))
    # the ratio is of the unrounded times; the printed times have 3 decimals
    assert ratio == pytest.approx(rows["trainer"][0] / rows["hand loop"][0], rel=0.01), out
    assert re.search(r"fp32 matmul reference \(best of 256\^3, 512\^3 x thread settings\): [\d.]+ GFLOP/s "
                     r"at (256|512)\^3, \d+ threads", out), out
    peak = re.search(r"^nominal fp32 peak: ([\d.]+) GFLOP/s = (\d+) cores x (\d+) FLOP/cycle \(.*\) x ([\d.]+) GHz", out,
                     re.M)
    assert peak, out
    gflops, cores, per_cycle, ghz = float(peak[1]), int(peak[2]), int(peak[3]), float(peak[4])
    assert gflops == pytest.approx(cores * per_cycle * ghz, rel=0.01) and per_cycle in (16, 32, 64)


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


def test_chunked_loss_memory_prints_both_variants_and_their_ratio() -> None:
    out = bench("chunked_loss_memory.py", "--vocab", "3000", "--batch", "2", "--seq-len", "512", "--dim", "32",
                "--chunk-tokens", "64")
    rows = dict(re.findall(r"^(full|chunked)\s+\d+\s+[\d.]+\s+([\d.]+)$", out, re.M))
    assert set(rows) == {"full", "chunked"}, out
    assert abs(float(rows["full"]) - float(rows["chunked"])) < 1e-5, out  # the same loss
    assert re.search(r"chunked / full: peak memory [\d.]+, time [\d.]+, loss difference [\d.e+-]+$", out, re.M), out


def test_prepare_benchmark_prints_the_command_against_the_bare_loop_and_its_start_up() -> None:
    out = bench("prepare.py", "--mb", "0.2", "--rounds", "1", "--startup-repeats", "1")
    rows = {int(m[1]): [float(x.replace(",", "")) for x in m.groups()[1:]]
            for m in re.finditer(r"^\s+([12])\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\.\.([\d.]+)\s+([\d.]+)\s+"
                                 r"([\d.]+)\s+([\d.]+)$", out, re.M)}
    assert set(rows) == {1, 2}, out
    for bare, command, ratio, low, high, *_ in rows.values():
        assert bare > 0 and command > 0 and low <= ratio <= high
        assert ratio == pytest.approx(command / bare, rel=0.01)  # one round: its ratio is the rates' ratio
    startup = dict(re.findall(r"^(python -c pass|tokenizer load|titan-data prepare --help|prepare of one small file)"
                              r"\s+([\d.]+)\s+[\d.]+\s+[\d.]+$", out, re.M))
    assert len(startup) == 4 and all(float(v) > 0 for v in startup.values()), out
    assert re.search(r"^load average \(1, 5, 15 min\) before: [\d.]+, [\d.]+, [\d.]+$", out, re.M), out


# Every other script at its smallest arguments, in the README's environment (llama3 and qwen3 both
# installed, so a script that names no spec would stop): it exits 0 and prints its figure.
SMALLEST = {
    "startup.py": (["--repeats", "1"], r"^titan-train --list\s+[\d.]+\s+[\d.]+$"),
    "profiling_overhead.py": (["--rounds", "1", "--steps", "4", "--seq-len", "16"],
                              r"^overhead ratio: [\d.]+ \(target <= 1.03\)$"),
    "scaling.py": (["--steps", "1", "--configs", "debugmodel", "--layouts", "single"],
                   r"^debugmodel\s+single\s+1\s+\d+"),
    "diloco.py": (["--steps", "2", "--val-batches", "1", "--seq-len", "16", "--batch", "2", "--layers", "1"],
                  r"^ratio diloco / synchronous: [\d.]+$"),
    "ft_overhead.py": (["--steps", "2", "--warmup", "0", "--rounds", "1", "--seq-len", "16", "--batch", "2",
                        "--layers", "1", "--threads", "1"], r"^step-time ratio torchft / ddp: [\d.]+$"),
    "data.py": (["data-ms", "--steps", "2", "--seq-len", "64", "--batch", "2"], r"^\s+[\d.]+\s+[\d.]+\s+[\d.]+%$"),
    "hf_initial_load_memory.py": (["--layers", "2"], r"^\| 1 \| \d+ \| \d+ \| \d+ \| \d+ \| \d+ \| yes \|"),
    # the planned side of torchtitan's published layouts: dry runs on meta under the fake process group
    "memory_plan.py": (["--only", "published", "--rows", "70B"], r"^\| 70B[^|]*\| 71\.9 \| [\d.]+ \| [\d.]+ \|$"),
    "muon.py": (["--steps", "3", "--lrs", "3e-3", "--val-batches", "1", "--layers", "1", "--seq-len", "16"],
                r"^best Muon / best AdamW validation loss: [\d.]+$"),
    "layer_stats.py": (["--steps", "40", "--seq-len", "16"],
                       r"^step-time ratio with / without: [\d.]+ \(target <= 1.03\)$"),
    "memory_breakdown.py": (["--batch", "1", "--seq-len", "64", "--steps", "1"],
                            r"^sum = peak resident memory of the step\s+\d+$"),
    # cp 2 against one process at 256 tokens: half the saved activations, even attention work
    "context_parallel.py": (["--seq-len", "256", "--cps", "1,2"], r"^2\s+yes\s+[\d.]+\s+0\.5\d*\s+1\.000$"),
    # One rank of a small layout under the fake process group (the 70B figure takes about a minute).
    "sharded_init.py": (["--flavor", "debugmodel", "--tp", "2", "--dp-shard", "2", "--rank", "3"],
                        r"^tiled / whole\s+[\d.]+$"),
    "end_of_run_memory.py": (["--rounds", "1", "--steps", "1", "--batch", "1", "--seq-len", "64"],
                             r"^report on: peak \d+ MB above the last step's RSS \(median\); report off: \d+ MB$"),
    # Without a torchtitan source: titan-core alone, and the script says so.
    "vs_torchtitan.py": (["--tt-src", "", "--steps", "4", "--batch", "1", "--seq-len", "32", "--layouts", "single"],
                         r"^single\s+titan\s+[\d.]+\s+\d+\s+[\d.]+\s+[\d.]+$"),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_every_benchmark_runs_in_a_default_install(script: str) -> None:
    args, figure = SMALLEST[script]
    out = bench(script, *args)
    assert re.search(figure, out, re.M), out


def test_every_benchmark_script_is_run_by_a_test() -> None:
    scripts = {p.name for p in (REPO / "benchmarks").glob("*.py") if not p.name.startswith("_")}
    covered = set(SMALLEST) | {"overhead.py", "attention.py", "moe_step_time.py", "moe_balance.py", "prepare.py",
                               "chunked_loss_memory.py", "soak.py",
                               "fsdp_gather_bytes.py"}  # by test_bf16_fsdp.py, which checks its ratio
    assert scripts == covered


def test_soak_prints_rss_per_interval_and_the_growth() -> None:
    out = bench("soak.py", "--steps", "6", "--base", "2", "--every", "2", "--layers", "1", "--seq-len", "16")
    rows = re.findall(r"^\s+([\d,]+)\s+([\d.]+)\s+([+-][\d.]+)%$", out, re.M)
    assert [int(step.replace(",", "")) for step, _, _ in rows] == [2, 4, 6], out
    assert all(float(mib) > 50 for _, mib, _ in rows) and float(rows[0][2]) == 0.0, out
    assert re.search(r"RSS at step 6 is [+-][\d.]+% vs step 2 \([+-][\d,]+ bytes/step\); target: at most \+3%", out), out
