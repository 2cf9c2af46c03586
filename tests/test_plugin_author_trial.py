"""What a plugin author writing from the docs alone ran into (a GPT-2-style spec and an int4 converter,
built as wheels outside the repository): each test here failed before its fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn


def test_conformance_classes_raise_no_pytest_deprecation(tmp_path: Path) -> None:
    """The scaffold's tests/test_conformance.py subclasses TrainSpecConformance / ConverterConformance. Their
    class-scoped fixture was an instance method, which pytest 9 deprecates (PytestRemovedIn10Warning): a plugin
    suite with warnings as errors (`filterwarnings = ["error"]`, common in CI) errored in every check."""
    (tmp_path / "test_kit.py").write_text(textwrap.dedent('''
        from titan_core.testing import ConverterConformance, TrainSpecConformance

        class TestConverter(ConverterConformance):
            converter = "float8"

        class TestSpec(TrainSpecConformance):
            train_spec = "llama3"
    '''))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestWarning",
                           "-k", "test_imports", "test_kit.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]


class _TiedLM(nn.Module):
    """The smallest tied model: an embedding and a head that share the [vocab, dim] table."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(8, 4)
        self.output = nn.Linear(4, 8, bias=False)
        self.output.weight = self.tok_embeddings.weight

    def tied_weights(self) -> list[tuple[str, str]]:
        return [("tok_embeddings.weight", "output.weight")]


def test_a_tp_plan_that_shards_one_side_of_a_tie_is_named_before_training() -> None:
    """A GPT-2 plan that shards the tied head column-wise but leaves the embedding out of the plan: the re-tie
    after tensor parallelism silently put the embedding's plain tensor into the head, and the first forward
    failed inside torch with 'aten.mm.default got mixed torch.Tensor and DTensor'. Now the re-tie names the tie
    and both layouts; a plan that shards both sides alike still ties them."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from titan_core import PluginError
    from titan_core.parallel import apply_tensor_parallel
    from titan_core.parallel.fake_group import fake_process_group

    with fake_process_group(rank=0, world_size=2):
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        with torch.device("meta"):
            one_sided, both = _TiedLM(), _TiedLM()
        with pytest.raises(PluginError, match=r"tok_embeddings.weight is a plain tensor, output.weight is a DTensor"):
            apply_tensor_parallel(one_sided, mesh, {"output": ColwiseParallel()})
        apply_tensor_parallel(both, mesh, {"tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
                                           "output": ColwiseParallel()})
        assert both.output.weight is both.tok_embeddings.weight


def test_a_registered_spec_names_the_module_that_registered_it() -> None:
    """`register_train_spec(spec)` (writing-a-train-spec.md, section 2) labelled the spec
    `<registered in titan_core.plugin.protocols>`, the module of the TrainSpec class, in `--list` and in every
    error about the plugin ('spec "gpt2b" (<registered in titan_core.plugin.protocols>) failed in the model's
    forward'): the module that called register_train_spec is the one to name."""
    import dataclasses

    from titan_core import register_train_spec
    from titan_core.plugin import discovery
    from titan_core.testing.tiny_spec import TINY_SPEC

    name = "author_trial_registered"
    register_train_spec(dataclasses.replace(TINY_SPEC, name=name))
    try:
        assert discovery.discover(discovery.SPECS)[name][0].distribution == f"<registered in {__name__}>"
    finally:
        discovery._registered[discovery.SPECS].pop(name)


def test_fast_with_compile_runs_the_compile_check(tmp_path: Path) -> None:
    """`titan-plugin check gpt2 --fast --compile` printed the five fast rows and 'all checks passed': the compile
    check that --compile asked for was dropped by --fast without a word. Asked for by name, it runs."""
    from titan_core.testing.checks import COMPILE_CHECK, Target, checks_for

    for kind in ("spec", "converter"):
        asked = Target(kind, "x", compile=True, workdir=tmp_path)
        assert COMPILE_CHECK in checks_for(asked, fast=True)
        assert COMPILE_CHECK not in checks_for(Target(kind, "x", workdir=tmp_path), fast=True)


def test_a_section_field_the_flavor_lacks_is_a_plugin_error_not_a_traceback() -> None:
    """A [gpt2] section with a field its flavor dataclass lacks (a typo, n_layer): setting it crashed titan-train
    with a TypeError traceback (exit 1). It is the plugin's error, told in one paragraph (exit code 2); still a
    TypeError, as writing-a-train-spec.md said."""
    import dataclasses

    from pydantic import BaseModel, ConfigDict

    from titan_core import PluginError
    from titan_core.testing.tiny_spec import TINY_SPEC

    class Section(BaseModel):
        model_config = ConfigDict(extra="forbid")
        n_layer: int | None = None

    spec = dataclasses.replace(TINY_SPEC, config_model=Section)
    flavor = next(iter(spec.flavors))
    with pytest.raises(PluginError, match=r"\['n_layer'\], which are not fields of") as caught:
        spec.model_args(flavor, Section(n_layer=3), vocab_size=None)
    assert isinstance(caught.value, TypeError)
