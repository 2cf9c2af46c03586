"""examples/titan-int8-fake: builds as a wheel with its entry point; the STE layer's numbers are right."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from titan_core.config.parallel_dims import ParallelDims
from titan_core.train.converters import apply_converters

from conftest import REPO, Wheels

EXAMPLE = REPO / "examples" / "titan-int8-fake"


@pytest.fixture(scope="module")
def wheel_install(wheels: Wheels) -> tuple[Path, Path]:
    """(the built wheel, a --target folder it is installed into)."""
    return wheels.wheel(EXAMPLE), wheels.site(EXAMPLE)


@pytest.fixture(scope="module")
def pkg(wheel_install: tuple[Path, Path]) -> ModuleType:
    """The package imported from the wheel's installation (not from the source tree)."""
    _, target = wheel_install
    sys.path.insert(0, str(target))
    try:
        module = importlib.import_module("titan_int8_fake")
    finally:
        sys.path.remove(str(target))
    assert Path(module.__file__).is_relative_to(target)
    return module


def test_wheel_declares_the_entry_point(wheel_install: tuple[Path, Path]) -> None:
    wheel, _ = wheel_install
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (ep_name,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = zf.read(ep_name).decode()
        metadata = zf.read(ep_name.replace("entry_points.txt", "METADATA")).decode()
    assert "[titan.model_converters]" in entry_points
    assert "int8fake = titan_int8_fake.converter:Int8FakeConverter" in entry_points
    assert "Requires-Dist: titan-core" in metadata
    assert "titan_int8_fake/layer.py" in names


def test_installed_entry_point_loads_a_model_converter(wheel_install: tuple[Path, Path]) -> None:
    _, target = wheel_install
    code = (
        "from importlib.metadata import entry_points\n"
        "from titan_core import ModelConverter\n"
        "(ep,) = [e for e in entry_points(group='titan.model_converters') if e.name == 'int8fake']\n"
        "cls = ep.load()\n"
        "assert issubclass(cls, ModelConverter), cls\n"
        "print(ep.dist.name, cls.__module__, sorted(cls.Config.model_fields))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(REPO / "src")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["titan-int8-fake", "titan_int8_fake.converter", "['bits',", "'filter_fqns',", "'fqns']"]


def reference_fake_quant(w: torch.Tensor, bits: int) -> torch.Tensor:
    """The README's formula, row by row in float64."""
    qmax = 2 ** (bits - 1) - 1
    rows = []
    for row in w.double():
        scale = row.abs().max() / qmax
        rows.append(torch.clamp(torch.round(row / scale), -qmax, qmax) * scale)
    return torch.stack(rows).to(w.dtype)


@pytest.mark.parametrize("bits", [8, 4])
def test_forward_is_quantize_dequantize(pkg: ModuleType, bits: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(24, 10)
    layer = pkg.Int8FakeQuantLinear.from_linear(linear, bits)
    w = linear.weight.detach()
    wq = pkg.fake_quantize(w, bits)
    ref = reference_fake_quant(w, bits)
    assert torch.allclose(wq, ref, rtol=0, atol=1e-7)
    # on the grid: at most 2**bits - 1 distinct levels per row, and the row's absmax is exact
    scale = w.abs().amax(1, keepdim=True) / (2 ** (bits - 1) - 1)
    levels = wq / scale
    assert torch.allclose(levels, levels.round(), atol=1e-4)
    assert torch.allclose(wq.abs().amax(1), w.abs().amax(1))
    x = torch.randn(3, 5, 24)
    assert torch.allclose(layer(x), x @ ref.T + linear.bias, atol=1e-6)
    err = (wq - w).abs().max().item()
    assert 0 < err <= scale.max().item() / 2 + 1e-7
    # zero rows stay zero (no 0/0)
    assert torch.equal(pkg.fake_quantize(torch.zeros(2, 4), bits), torch.zeros(2, 4))


def test_backward_is_straight_through(pkg: ModuleType) -> None:
    torch.manual_seed(0)
    layer = pkg.Int8FakeQuantLinear(16, 8, bias=True)
    x = torch.randn(6, 16, requires_grad=True)
    g = torch.randn(6, 8)
    layer(x).backward(g)
    # dL/dW = g^T x exactly as for a plain linear (the rounding is passed through),
    # dL/dx uses the quantized weight the forward used.
    wq = pkg.fake_quantize(layer.weight.detach(), 8)
    assert torch.allclose(layer.weight.grad, g.T @ x.detach(), atol=1e-6)
    assert torch.allclose(layer.bias.grad, g.sum(0), atol=1e-6)
    assert torch.allclose(x.grad, g @ wq, atol=1e-6)


def test_converter_selects_and_swaps_through_the_pipeline(pkg: ModuleType) -> None:
    with torch.device("meta"):
        model = nn.ModuleDict({
            "layers": nn.ModuleDict({"0": nn.ModuleDict({"w1": nn.Linear(8, 8), "w2": nn.Linear(8, 8)})}),
            "output": nn.Linear(8, 4),
        })
    conv = pkg.Int8FakeConverter(pkg.Int8FakeConfig(bits=6), parallel_dims=ParallelDims(1, 1, 1, 1, 1), job=None)
    table = apply_converters(model, [("int8fake", conv)], spec=None)
    assert [(r.module, r.after) for r in table.rows] == [
        ("layers.0.w1", "Int8FakeQuantLinear"), ("layers.0.w2", "Int8FakeQuantLinear")]
    assert model["layers"]["0"]["w1"].bits == 6
    assert type(model["output"]) is nn.Linear
    model.to_empty(device="cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    x = torch.randn(2, 8)
    w1 = model["layers"]["0"]["w1"]
    assert torch.allclose(w1(x), x @ pkg.fake_quantize(w1.weight.detach(), 6).T + w1.bias, atol=1e-6)
