"""The converter pipeline: overlap resolution, errors, the conversion table, optimizer hooks."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from titan_core.config.parallel_dims import ParallelDims
from titan_core.errors import ConfigError
from titan_core.plugin.protocols import ModelConverter
from titan_core.train.converters import ConversionTable, apply_converters, register_converter_hooks


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(16, 16, bias=False)
        self.w1 = nn.Linear(16, 32, bias=False)
        self.w2 = nn.Linear(32, 16, bias=False)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.output = nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer.w2(torch.relu(layer.w1(layer.wq(x))))
        return self.output(x)


class TaggedLinear(nn.Linear):
    """What the toy converters swap in: a Linear that remembers who converted it."""


class PickConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    names: list[str] = Field(default_factory=list, description="Name endings to select.")


class Pick(ModelConverter):
    """Selects linears whose fqn ends with one of ``names``; swaps in TaggedLinear."""

    Config = PickConfig

    def select(self, model: nn.Module) -> list[str]:
        return [fqn for fqn, m in model.named_modules() if isinstance(m, nn.Linear)
                and any(fqn.endswith(n) for n in self.config.names)]

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:
            parent_name, _, child = fqn.rpartition(".")
            parent = model.get_submodule(parent_name)
            old = getattr(parent, child)
            new = TaggedLinear(old.in_features, old.out_features, bias=False, device=old.weight.device)
            new.weight = old.weight
            setattr(parent, child, new)

    def selection_keys(self) -> list[str]:
        return ["names"]


class Counting(Pick):
    """A Pick that also counts its optimizer hooks."""

    def __init__(self, config: BaseModel, **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.pre_calls: list[int] = []
        self.post_calls: list[int] = []

    def pre_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        self.pre_calls.append(len(model_parts))

    def post_optimizer_hook(self, model_parts: list[nn.Module]) -> None:
        self.post_calls.append(len(model_parts))


def make(cls: type[Pick], *names: str) -> Pick:
    dims = ParallelDims(1, 1, 1, 1, 1)
    return cls(PickConfig(names=list(names)), parallel_dims=dims, job=None)  # type: ignore[arg-type]


def owners(table: ConversionTable) -> dict[str, str]:
    return {row.module: row.converter for row in table.rows}


def test_later_converter_wins_on_overlap() -> None:
    model = Toy()
    a = make(Pick, "w1", "w2", "wq")
    b = make(Pick, "w1")
    table = apply_converters(model, [("a", a), ("b", b)], spec=None)
    got = owners(table)
    assert got == {
        "layers.0.wq": "a", "layers.0.w2": "a", "layers.1.wq": "a", "layers.1.w2": "a",
        "layers.0.w1": "b", "layers.1.w1": "b",
    }
    assert isinstance(model.layers[0].w1, TaggedLinear)
    assert type(model.output) is nn.Linear
    assert table.modules_of("b") == ["layers.0.w1", "layers.1.w1"]


def test_disjoint_selections_each_keep_theirs() -> None:
    model = Toy()
    table = apply_converters(model, [("a", make(Pick, "wq")), ("b", make(Pick, "output"))], spec=None)
    assert owners(table) == {"layers.0.wq": "a", "layers.1.wq": "a", "output": "b"}
    assert all(row.before == "Linear" and row.after == "TaggedLinear" for row in table.rows)


def test_converter_left_empty_names_the_winner_and_keys() -> None:
    model = Toy()
    with pytest.raises(ConfigError) as info:
        apply_converters(model, [("a", make(Pick, "w1")), ("b", make(Pick, "w1", "w2"))], spec=None)
    text = str(info.value)
    assert 'converter "a"' in text
    assert 'taken by "b"' in text
    assert "a.names" in text and "b.names" in text
    assert "layers.0.w1" in text
    # nothing was converted: the check happens before any rewrite
    assert type(model.layers[0].w1) is nn.Linear


def test_converter_selecting_nothing_says_so() -> None:
    with pytest.raises(ConfigError, match=r'converter "a" was requested but selected no module.*a\.names'):
        apply_converters(Toy(), [("a", make(Pick, "nothing_like_this"))], spec=None)


def test_unknown_fqn_is_an_error() -> None:
    class Bad(Pick):
        def select(self, model: nn.Module) -> list[str]:
            return ["layers.0.w1", "layers.0.w1x"]

    with pytest.raises(ConfigError, match=r"converter \"bad\" selected 1 module.*'layers\.0\.w1x'.*Did you mean \"layers\.0\.w1\"\?"):
        apply_converters(Toy(), [("bad", make(Bad))], spec=None)


def test_table_format_and_json(tmp_path) -> None:
    table = apply_converters(Toy(), [("a", make(Pick, "wq")), ("longer_name", make(Pick, "output"))], spec=None)
    lines = table.format().splitlines()
    assert lines[0].split() == ["module", "converter", "before", "after"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["layers.0.wq", "a", "Linear", "TaggedLinear"]
    assert lines[4].split() == ["output", "longer_name", "Linear", "TaggedLinear"]
    # columns are aligned: the converter column starts at the same offset in every row
    starts = {line.index(" " + word + " ") for line, word in zip(lines[2:], ["a", "a", "longer_name"])}
    assert len(starts) == 1 and lines[0].index(" converter") in starts
    path = tmp_path / "sub" / "conversions.json"
    table.write(path)
    assert json.loads(path.read_text())[-1] == {
        "module": "output", "converter": "longer_name", "before": "Linear", "after": "TaggedLinear"}
    assert ConversionTable().format() == "no modules converted"


def test_compatible_with_runs_before_anything() -> None:
    from titan_core.errors import TitanError

    class Picky(Pick):
        def compatible_with(self, spec) -> None:
            raise TitanError(f"cannot serve {spec}")

    model = Toy()
    with pytest.raises(TitanError, match="cannot serve the-spec"):
        apply_converters(model, [("a", make(Pick, "wq")), ("p", make(Picky, "w1"))], spec="the-spec")  # type: ignore[arg-type]
    assert type(model.layers[0].wq) is nn.Linear


class Container(torch.optim.Optimizer):
    """Like the trainer's OptimizersContainer: one Optimizer over several parts' optimizers."""

    def __init__(self, parts: list[nn.Module]) -> None:
        self.inner = [torch.optim.SGD(p.parameters(), lr=0.1) for p in parts]
        params = [p for part in parts for p in part.parameters()]
        super().__init__(params, {"lr": 0.1})

    def step(self, closure=None):  # type: ignore[override]
        for opt in self.inner:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.inner:
            opt.zero_grad(set_to_none=set_to_none)


@pytest.mark.parametrize("use_container", [False, True])
def test_hooks_run_once_per_step(use_container: bool) -> None:
    parts = [Toy(), Toy()]
    counting = make(Counting, "wq")
    plain = make(Pick, "w1")
    opt: torch.optim.Optimizer
    if use_container:
        opt = Container(parts)
    else:
        opt = torch.optim.SGD([p for part in parts for p in part.parameters()], lr=0.1)
    hooks = register_converter_hooks(opt, [counting, plain], parts)
    assert hooks.registered == ["Counting.pre_optimizer_hook", "Counting.post_optimizer_hook"]
    x = torch.randn(4, 16)
    for _ in range(3):
        opt.zero_grad()
        sum(part(x).sum() for part in parts).backward()
        opt.step()
    assert counting.pre_calls == [2, 2, 2]
    assert counting.post_calls == [2, 2, 2]
    hooks.remove()
    opt.step()
    assert len(counting.post_calls) == 3


def test_instance_level_hook_counts_as_override() -> None:
    class Maybe(Pick):
        def __init__(self, config: BaseModel, **kwargs) -> None:
            super().__init__(config, **kwargs)
            self.calls = 0
            self.post_optimizer_hook = self._after  # type: ignore[method-assign]

        def _after(self, model_parts: list[nn.Module]) -> None:
            self.calls += 1

    model = Toy()
    maybe = make(Maybe, "wq")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hooks = register_converter_hooks(opt, [maybe, make(Pick, "w1")], [model])
    assert hooks.registered == ["Maybe.post_optimizer_hook"]
    opt.step()
    assert maybe.calls == 1
