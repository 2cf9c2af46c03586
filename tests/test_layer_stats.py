"""metrics.layer_stats (train/layer_stats.py) and the report's layer heatmaps and spike marks.

In process, on the parity tests' tiny model (2 blocks): each logged ``layer/<id>/*`` figure equals a hand
computation from the weights before and after the step, the gradients before clipping and the blocks'
outputs (1e-6); a step that does not log installs no hook and measures nothing. Real 2-process FSDP2, TP 2
and PP 2 runs give one process's figures (1e-6). The report draws a heatmap per figure and a mark on the loss curve at
each spike the guard skipped and each rollback.
"""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from test_ema import tiny_run

from conftest import DEBUG_LLAMA_2_LAYERS, PARITY_GLOBAL_BATCH, titan, torchrun

STATS = ("param_norm", "grad_norm", "update_ratio", "act_rms", "max_attn_logit")


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def largest_logit(trainer: Any, weights: dict[str, torch.Tensor], layer: str, inputs: list[torch.Tensor]) -> float:
    """The largest causal q.k/sqrt(head_dim) of any head, from the attention's inputs and the weights."""
    from titan_llama.model import apply_rope

    model = trainer.model_parts[0]
    head_dim = model.args.head_dim
    best = -math.inf
    for x in inputs:
        q = (x.double() @ weights[f"layers.{layer}.attention.wq.weight"].double().T).unflatten(-1, (-1, head_dim))
        k = (x.double() @ weights[f"layers.{layer}.attention.wk.weight"].double().T).unflatten(-1, (-1, head_dim))
        q, k = apply_rope(q, model.freqs_cis), apply_rope(k, model.freqs_cis)  # float32 inside, as the model
        scores = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) / math.sqrt(head_dim)
        seq = x.shape[1]
        future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        best = max(best, scores.masked_fill(future, -math.inf).max().item())
    return best


def test_each_figure_equals_a_hand_computation_from_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core import Trainer

    seen: list[dict[str, Any]] = []  # per step: gradients (as clipped), block outputs, and the hooks found
    step = Trainer.train_step_measured

    def watched(self: Any, batches: Any, measure: Any) -> Any:
        outputs: dict[str, list[torch.Tensor]] = {}
        blocks = dict(self.model_parts[0].layers.named_children())
        hooks = {name: len(block._forward_hooks) for name, block in blocks.items()}
        mine = [block.register_forward_hook(lambda m, a, out, name=name: outputs.setdefault(name, []).append(
            out.detach().clone())) for name, block in blocks.items()]
        mine += [block.attention.register_forward_pre_hook(lambda m, a, name=name: outputs.setdefault(
            f"attention {name}", []).append(a[0].detach().clone())) for name, block in blocks.items()]
        result = step(self, batches, measure)
        for handle in mine:
            handle.remove()
        grads = {f"{b}.{n}": p.grad.clone() for b, block in blocks.items() for n, p in block.named_parameters()}
        seen.append({"outputs": outputs, "grads": grads, "hooks": hooks, "measured": self.layer_stats.measured_steps})
        return result

    monkeypatch.setattr(Trainer, "train_step_measured", watched)
    # clipping at 0.05 (far below the gradient norm): the figures are of the gradients before it
    run = tiny_run(tmp_path / "run", "metrics.layer_stats=true", "training.steps=3", "metrics.log_freq=2",
                   "training.max_norm=0.05")
    logged = {r["step"]: r for r in records(tmp_path / "run")}
    assert sorted(logged) == [1, 2, 3]  # every step logs (the first, every second, the last)
    for step_no in (1, 2, 3):
        record, watch = logged[step_no], seen[step_no - 1]
        before, after = run.weights[step_no - 1], run.weights[step_no]
        coeff = 0.05 / (record["grad_norm"] + 1e-6)  # torch's clip coefficient
        for layer in ("0", "1"):
            names = [k for k in before if k.startswith(f"layers.{layer}.")]
            param = math.sqrt(sum(before[k].double().square().sum().item() for k in names))
            delta = math.sqrt(sum((after[k].double() - before[k].double()).square().sum().item() for k in names))
            grad = math.sqrt(sum((watch["grads"][k.removeprefix("layers.")].double() / coeff).square().sum().item()
                                 for k in names))
            outs = watch["outputs"][layer]
            rms = math.sqrt(sum(o.double().square().sum().item() for o in outs) / sum(o.numel() for o in outs))
            got = {s: record[f"layer/{layer}/{s}"] for s in STATS}
            want = {"param_norm": param, "grad_norm": grad, "update_ratio": delta / param, "act_rms": rms,
                    "max_attn_logit": largest_logit(run.trainer, before, layer, watch["outputs"][f"attention {layer}"])}
            for stat in STATS:
                assert got[stat] == pytest.approx(want[stat], rel=1e-6), (step_no, layer, stat, got, want)
            assert 0 < got["update_ratio"] < 0.1 and got["grad_norm"] > 0.05
        assert all(n == 1 for n in watch["hooks"].values())  # one hook per block during the step
    assert [w["measured"] for w in seen] == [1, 2, 3]
    assert all(not block._forward_hooks for block in run.trainer.model_parts[0].layers.children())  # and none after


def test_a_step_that_does_not_log_installs_no_hook_and_measures_nothing(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core import Trainer

    during: list[tuple[int, int, int]] = []  # (step, hooks on the blocks during its backward, steps measured)
    forward_backward = Trainer.forward_backward

    def counted(self: Any, *args: Any) -> Any:
        hooks = sum(len(b._forward_hooks) for b in self.model_parts[0].layers.children())
        during.append((self.step + 1, hooks, self.layer_stats.measured_steps))
        return forward_backward(self, *args)

    monkeypatch.setattr(Trainer, "forward_backward", counted)
    tiny_run(tmp_path / "run", "metrics.layer_stats=true", "training.steps=4", "metrics.log_freq=3")
    # steps 1, 3 and 4 log (the first, every third, the last); step 2 measures nothing
    assert during == [(1, 2, 1), (2, 0, 1), (3, 2, 2), (4, 2, 3)]
    logged = records(tmp_path / "run")
    assert [r["step"] for r in logged] == [1, 3, 4]
    assert all(sum(k.startswith("layer/") for k in r) == 2 * len(STATS) for r in logged)


def test_off_by_default_nothing_is_recorded(tmp_path: Path) -> None:
    run = tiny_run(tmp_path / "run", "training.steps=1")
    assert run.trainer.layer_stats is None
    assert not [k for k in records(tmp_path / "run")[0] if k.startswith("layer/")]


@pytest.mark.slow
def test_fsdp2_x2_tp2_and_pp2_give_the_figures_of_one_process(tmp_path: Path) -> None:
    common = ("--training.steps=2", "--metrics.log_freq=1", "--metrics.report=false", "--lr_scheduler.warmup_steps=1",
              "--metrics.layer_stats=true")
    full = f"--training.local_batch_size={PARITY_GLOBAL_BATCH}"
    with ThreadPoolExecutor(max_workers=4) as pool:
        one = pool.submit(titan, tmp_path / "one", *DEBUG_LLAMA_2_LAYERS, *common, full)
        fsdp = pool.submit(titan, tmp_path / "fsdp2", *DEBUG_LLAMA_2_LAYERS, *common,
                           f"--training.local_batch_size={PARITY_GLOBAL_BATCH // 2}", "--parallelism.dp_shard=2",
                           nproc=2)
        tp = pool.submit(torchrun, tmp_path / "tp2", *DEBUG_LLAMA_2_LAYERS, *common, full, "--parallelism.tp=2")
        # a pipeline stage's first step runs one shape-learning forward, which must not count
        pp = pool.submit(torchrun, tmp_path / "pp2", *DEBUG_LLAMA_2_LAYERS, *common, full, "--parallelism.pp=2")
        runs = {"one": one.result(), "fsdp2": fsdp.result(), "tp2": tp.result(), "pp2": pp.result()}
    for name, run in runs.items():
        assert run.code == 0, f"{name}: {run.text}"
    reference = records(tmp_path / "one")
    keys = [k for k in reference[0] if k.startswith("layer/")]
    assert len(keys) == 2 * len(STATS) and len(reference) == 2
    for name in ("fsdp2", "tp2", "pp2"):
        got = records(tmp_path / name)
        assert len(got) == 2, name
        for key in keys:
            worst = max(abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(reference, got))
            print(f"{name} {key}: vs one process, max relative difference {worst:.1e}")
            assert worst <= 1e-6, (name, key, [x[key] for x in reference], [y[key] for y in got])


def test_the_report_draws_a_heatmap_per_figure_and_marks_each_spike_on_the_loss_curve(tmp_path: Path) -> None:
    from titan_core.observability.report import write_run_report

    lines = []
    for step in (10, 20, 30):
        record: dict[str, Any] = {"step": step, "loss": 3.0 - step / 100, "grad_norm": 1.0, "lr": 1e-3}
        for layer in range(3):
            record |= {f"layer/{layer}/{s}": (layer + 1) * step * 1e-3 for s in STATS}
            record |= {f"qk_clip/{layer}/max_logit_before": 50.0 + layer, f"qk_clip/{layer}/clipped_heads": layer}
        lines.append(record)
    lines.append({"step": 25, "loss": 9.0, "grad_norm": 1.0, "lr": 1e-3, "spike_skipped": 1})
    lines.append({"step": 27, "loss": 9.1, "grad_norm": 1.0, "lr": 1e-3, "spike_skipped": 1, "spike_rollback": 1})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    html = write_run_report(tmp_path).html.read_text()
    maps = re.findall(r'<svg class="heatmap" data-metric="(layer|qk_clip)/(\w+)".*?</svg>', html)
    assert sorted(maps) == sorted([("layer", s) for s in STATS] + [("qk_clip", "max_logit_before"),
                                                                  ("qk_clip", "clipped_heads")])
    grad_map = re.search(r'<svg class="heatmap" data-metric="layer/grad_norm".*?</svg>', html).group(0)
    cells = re.findall(r'<rect class="cell"[^>]*fill="(#[0-9a-f]{6})"><title>layer (\d+), step (\d+): ([^<]+)</title>',
                       grad_map)
    assert len(cells) == 9  # 3 layers x 3 logged steps
    assert {(layer, step) for _, layer, step, _ in cells} == {(str(i), str(s)) for i in range(3) for s in (10, 20, 30)}
    lowest = next(c for c in cells if c[1:3] == ("0", "10"))
    highest = next(c for c in cells if c[1:3] == ("2", "30"))
    assert lowest[0] == "#440154" and highest[0] == "#fde725" and lowest[3] == "0.01"  # the ramp's two ends
    loss_chart = re.search(r'<svg class="chart" data-metric="loss".*?</svg>', html).group(0)
    marks = re.findall(r'<line class="mark" data-kind="([\w-]+)" data-step="(\d+)"', loss_chart)
    assert marks == [("spike-skipped", "25"), ("spike-skipped", "27"), ("spike-rollback", "27")]
    assert "mark" not in re.search(r'<svg class="chart" data-metric="lr".*?</svg>', html).group(0)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0}) + "\n")
    html = write_run_report(tmp_path).html.read_text()
    assert 'class="heatmap"' not in html and 'class="mark"' not in html and "Per layer" not in html
