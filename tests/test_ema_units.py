"""[ema] without a training run: the update, its interval, the swap, and the settings refused (fast tier).

The runs themselves (the EMA against a hand-computed one, resume, export, FSDP2) are in test_ema.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import assert_user_error


def test_the_ema_folds_the_weights_in_every_interval_steps_and_swaps_in_and_back() -> None:
    from titan_core.train.ema import WeightAverage

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ema = WeightAverage([model], decay=0.75, interval=2)
    ema.start()
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.after_step(1)  # not an update step
    assert all(torch.equal(a, start[n]) for n, a in zip(ema.names, ema.averages))
    ema.after_step(2)
    trained = {k: v.detach().clone() for k, v in model.named_parameters()}
    for name, average in zip(ema.names, ema.averages):
        assert torch.equal(average, start[name] * 0.75 + trained[name] * 0.25)
    with pytest.raises(RuntimeError, match="inside"):
        with ema.swapped_in():
            assert all(torch.equal(p, a) for p, a in zip(model.parameters(), ema.averages))
            raise RuntimeError("a failure inside the block")
    assert all(torch.equal(p, trained[n]) for n, p in model.named_parameters())  # back, bit for bit


@pytest.mark.parametrize(("args", "fragments"), [
    (["--ema.decay=1"], ["ema.decay", "less than 1"]),
    (["--ema.decay=0"], ["ema.decay", "greater than 0"]),
    (["--ema.decay=0.99", "--ema.interval=0"], ["ema.interval", "greater than or equal to 1"]),
    (["--checkpoint.export_weights=ema"], ["checkpoint.export_weights=ema needs an EMA", "--ema.decay="]),
    (["--checkpoint.export_weights=best"], ["checkpoint.export_weights", "'raw' or 'ema'"]),
    (["--ema.decay=0.99", "--fault_tolerance.local_replicas=2"], ["ema.decay with fault tolerance is not supported"]),
])
def test_bad_ema_settings_are_refused_with_the_fix(cli, args: list[str], fragments: list[str]) -> None:
    assert_user_error(cli("--print-config", *args), *fragments)
