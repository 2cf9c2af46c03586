"""[stability] qk_clip_threshold (train/qk_clip.py, models/attention_logits.py, titan-llama's attention).

A run built to blow up (lr 0.05 on the tiny model): without QK-clip its largest attention logit climbs far
past tau; with it, after every step the largest logit on the step's batch, computed here by hand from the
weights after the step, is at most tau, and the logged ``qk_clip/<id>/max_logit`` says so. The factors
split each head's cut between its query and key rows (grouped keys too). A real 2-process FSDP2 run,
whose projection rows live in shards, and a TP 2 run, whose heads are split over the ranks, give one
process's figures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from test_ema import tiny_run
from test_layer_stats import largest_logit

from conftest import DEBUG_LLAMA_2_LAYERS, PARITY_GLOBAL_BATCH, titan

TAU = 4.0
BLOW_UP = ("optimizer.lr=0.05", "lr_scheduler.warmup_steps=1", "training.steps=6")


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def test_after_each_step_no_head_logit_exceeds_tau_on_a_run_built_to_blow_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_core import Trainer

    unclipped = tiny_run(tmp_path / "free", *BLOW_UP, "metrics.layer_stats=true")
    free = records(tmp_path / "free")
    assert max(r["layer/0/max_attn_logit"] for r in free) > 3 * TAU  # it does blow up

    after: list[float] = []  # per step, by hand: the largest logit on its last micro-batch, weights after the step
    step = Trainer.train_step_measured

    def checked(self: Any, batches: Any, measure: Any) -> Any:
        result = step(self, batches, measure)
        model = self.model_parts[0]
        inputs: dict[str, torch.Tensor] = {}
        hooks = [block.attention.register_forward_pre_hook(lambda m, a, n=n: inputs.__setitem__(n, a[0].detach()))
                 for n, block in model.layers.named_children()]
        with torch.no_grad():
            model(self.last_micro_batch[0])
        for hook in hooks:
            hook.remove()
        weights = {n: p.detach() for n, p in model.named_parameters()}
        after.append(max(largest_logit(self, weights, n, [x]) for n, x in inputs.items()))
        return result

    monkeypatch.setattr(Trainer, "train_step_measured", checked)
    clipped = tiny_run(tmp_path / "clipped", *BLOW_UP, f"stability.qk_clip_threshold={TAU}")
    logged = records(tmp_path / "clipped")
    print(f"\nunclipped largest logit per step: {[round(r['layer/0/max_attn_logit'], 2) for r in free]}")
    print(f"clipped, after each step, by hand: {[round(x, 4) for x in after]}")
    assert len(after) == 6 and max(after) <= TAU * (1 + 1e-5), after
    assert max(after) >= TAU * (1 - 1e-5)  # it was reached and cut: the clip bit
    for r, by_hand in zip(logged, after):
        top = max(r[f"qk_clip/{n}/max_logit"] for n in ("0", "1"))
        assert top <= TAU and top == pytest.approx(by_hand, rel=1e-5), (r, by_hand)
        assert all(r[f"qk_clip/{n}/max_logit_before"] >= r[f"qk_clip/{n}/max_logit"] for n in ("0", "1"))
    assert sum(r[f"qk_clip/{n}/clipped_heads"] for r in logged for n in ("0", "1")) == clipped.trainer.qk_clip.clipped_heads > 0
    assert unclipped.trainer.qk_clip is None


def test_the_factors_cut_each_head_to_tau_with_grouped_keys() -> None:
    from titan_core.train.qk_clip import head_factors

    maxima = torch.tensor([8.0, 2.0, 1.0, 16.0])  # 4 query heads on 2 key heads: (0, 1) and (2, 3)
    query, key = head_factors(maxima, kv_heads=2, threshold=4.0)
    per_head = query * key.repeat_interleave(2)
    assert torch.allclose(per_head, torch.tensor([0.5, 1.0, 1.0, 0.25]))
    assert torch.allclose(key, torch.tensor([math.sqrt(0.5), math.sqrt(0.25)]))
    query, key = head_factors(torch.tensor([9.0, 1.0]), kv_heads=2, threshold=4.0)  # a key head per query head
    assert torch.allclose(query, key) and torch.allclose(query * key, torch.tensor([4 / 9, 1.0]))


def test_qk_clip_with_pp_or_fault_tolerance_is_refused_naming_the_keys() -> None:
    from pydantic import ValidationError

    from titan_core.config.job import JobConfig

    with pytest.raises(ValidationError, match=r"stability.qk_clip_threshold=50.0 works on one process, under "
                                              r"FSDP2 and under tensor parallelism, not yet with parallelism.pp=2"):
        JobConfig.model_validate({"stability": {"qk_clip_threshold": 50}, "parallelism": {"pp": 2}},
                                 context={"world_size": 2})
    for layout in ({"dp_shard": 2}, {"tp": 2}):
        JobConfig.model_validate({"stability": {"qk_clip_threshold": 50}, "parallelism": layout},
                                 context={"world_size": 2})
    for section in ({"stability": {"qk_clip_threshold": 50}}, {"metrics": {"layer_stats": True}}):
        with pytest.raises(ValidationError, match=r"(qk_clip_threshold|layer_stats) with fault tolerance is not "
                                                  r"supported yet"):
            JobConfig.model_validate({**section, "fault_tolerance": {"local_replicas": 2}}, context={"world_size": 1})


@pytest.mark.slow
def test_fsdp2_x2_and_tp2_clip_as_one_process(tmp_path: Path) -> None:
    """FSDP2: each rank scales the rows of its shard. TP: each rank measures and cuts its own heads, and the
    logged figures cover every head (gathered over tp)."""
    # tau 0.5 clips most heads at every step at an ordinary learning rate. (At the blow-up lr 0.05, TP 2
    # alone, without QK-clip, parts from one process by 1.3e-5 in grad norm at step 3: reduction order.)
    common = ("--training.steps=4", "--metrics.log_freq=1", "--metrics.report=false", "--lr_scheduler.warmup_steps=1",
              "--optimizer.lr=0.01", "--stability.qk_clip_threshold=0.5")
    one = titan(tmp_path / "one", *DEBUG_LLAMA_2_LAYERS, *common, f"--training.local_batch_size={PARITY_GLOBAL_BATCH}")
    a = records(tmp_path / "one")
    assert one.code == 0, one.text
    assert all(r["qk_clip/0/clipped_heads"] > 0 for r in a)
    layouts = {"fsdp2 x 2": (f"--training.local_batch_size={PARITY_GLOBAL_BATCH // 2}", "--parallelism.dp_shard=2"),
               "tp 2": (f"--training.local_batch_size={PARITY_GLOBAL_BATCH}", "--parallelism.tp=2")}
    for name, layout in layouts.items():
        two = titan(tmp_path / name.replace(" ", ""), *DEBUG_LLAMA_2_LAYERS, *common, *layout, nproc=2)
        assert two.code == 0, two.text
        b = records(tmp_path / name.replace(" ", ""))
        for key in ("loss", "grad_norm", *(k for k in a[0] if k.startswith("qk_clip/") and "clipped" not in k)):
            worst = max(abs(x[key] - y[key]) / abs(x[key]) for x, y in zip(a, b))
            print(f"{key}: {name} vs one process, max relative difference {worst:.1e}")
            # Seen: losses within 1.2e-7 and equal gradient norms, but the largest logit before the clip (one
            # maximum over every query-key pair, measured after the update) within 1.1e-5 under TP and 3e-6
            # under FSDP2. The cause of that larger spread was not pinned down; the clipped figures are equal.
            limit = 1e-6 if key in ("loss", "grad_norm") else 1e-4
            assert worst <= limit, (name, key, [x[key] for x in a], [y[key] for y in b])
        for layer in ("0", "1"):
            assert [r[f"qk_clip/{layer}/clipped_heads"] for r in a] == [r[f"qk_clip/{layer}/clipped_heads"] for r in b]
