"""QK-clip on qwen3, whose attention has QK-norm (models/attention_logits.py, train/qk_clip.py).

The norms undo any scaling of the projections and share their weights over every head, so the clip scales
the two norm weights of a layer by sqrt of its worst head's factor. A run built to blow up: after every step,
a forward on the step's last micro-batch with the weights after the step (recorded by the model itself, no
adjusting) has no head above tau, the worst one reaches it, and the logged figures say so. FSDP2 x 2 (each
rank scales its shard of the norm weights) and TP 2 (each rank measures its own heads; the worst is taken
over every rank) give one process's figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import titan

TAU = 2.0
RUN = ("--spec", "qwen3", "--flavor", "debugmodel", "--qwen3.n_layers=2", "--training.seq_len=64",
       "--metrics.log_freq=1", "--metrics.report=false", "--lr_scheduler.warmup_steps=1", "--training.seed=0")


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def test_after_each_step_no_head_exceeds_tau_and_the_norm_weights_carry_the_cut(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core import Trainer
    from titan_core.models.attention_logits import attention_logits
    from titan_core.plan.resolve import resolve_config

    after: list[float] = []
    step = Trainer.train_step_measured

    def checked(self: Any, batches: Any, measure: Any) -> Any:
        result = step(self, batches, measure)
        with torch.no_grad(), attention_logits() as request:  # records only: the weights as the step left them
            self.model_parts[0](self.last_micro_batch[0])
        after.append(max(float(h.max.max()) for h in request.heads.values()))
        return result

    monkeypatch.setattr(Trainer, "train_step_measured", checked)
    pairs = [arg[2:].split("=", 1) for arg in RUN[4:]] + [
        ["model.spec", "qwen3"], ["model.flavor", "debugmodel"], ["optimizer.lr", "0.02"], ["training.steps", "5"],
        ["training.local_batch_size", "2"], ["stability.qk_clip_threshold", str(TAU)],
        ["job.run_dir", str(tmp_path / "run")]]
    trainer = Trainer(resolve_config(config_source=None, override_pairs=[tuple(p) for p in pairs]))  # type: ignore[misc]
    trainer.setup()
    norms_before = {n: p.detach().clone() for n, p in trainer.model_parts[0].named_parameters() if "_norm" in n}
    trainer.train()
    logged = _records(tmp_path / "run")
    print(f"\nlargest logit after each step: {[round(x, 4) for x in after]}")
    assert len(after) == 5 and max(after) <= TAU * (1 + 1e-5), after
    assert max(after) >= TAU * (1 - 1e-5)  # reached and cut
    for r, by_model in zip(logged, after):
        top = max(r[f"qk_clip/{n}/max_logit"] for n in ("0", "1"))
        assert top <= TAU and top == pytest.approx(by_model, rel=1e-5), (r, by_model)
    assert trainer.qk_clip is not None and trainer.qk_clip.clipped_heads > 0
    # The cut is in the QK-norm weights (the optimizer moves them too, but the clip shrinks them as a whole).
    shrunk = [n for n, p in trainer.model_parts[0].named_parameters()
              if n.endswith(("q_norm.weight", "k_norm.weight")) and p.norm() < norms_before[n].norm()]
    assert shrunk, "no QK-norm weight was scaled down"


@pytest.mark.slow
def test_fsdp2_x2_and_tp2_clip_as_one_process(tmp_path: Path) -> None:
    common = (*RUN, "--training.steps=4", "--optimizer.lr=0.01", "--stability.qk_clip_threshold=0.5")
    one = titan(tmp_path / "one", *common, "--training.local_batch_size=4")
    assert one.code == 0, one.text
    a = _records(tmp_path / "one")
    # The first step cuts every layer; the shrunk norm weights keep most later steps under tau.
    assert a[0]["qk_clip/0/clipped_heads"] > 0 and a[0]["qk_clip/1/clipped_heads"] > 0, a
    layouts = {"fsdp2": ("--training.local_batch_size=2", "--parallelism.dp_shard=2"),
               "tp2": ("--training.local_batch_size=4", "--parallelism.tp=2")}
    for name, layout in layouts.items():
        two = titan(tmp_path / name, *common, *layout, nproc=2)
        assert two.code == 0, two.text
        b = _records(tmp_path / name)
        for key in ("loss", "grad_norm", *(k for k in a[0] if k.startswith("qk_clip/") and "clipped" not in k)):
            worst = max(abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(a, b))
            print(f"{key}: {name} vs one process, max relative difference {worst:.1e}")
            limit = 1e-6 if key in ("loss", "grad_norm") else 1e-4  # as the llama test: the maxima to 1e-4
            assert worst <= limit, (name, key, [x[key] for x in a], [y[key] for y in b])
        for layer in ("0", "1"):
            assert [r[f"qk_clip/{layer}/clipped_heads"] for r in a] == [r[f"qk_clip/{layer}/clipped_heads"] for r in b]
