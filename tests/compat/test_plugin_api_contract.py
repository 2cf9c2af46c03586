"""The plugin contract's promises, in-process: the version a plugin declares is served or refused at
discovery (real entry points, read from package metadata), and what plugins receive is resolved."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import titan_core
from titan_core import PLUGIN_API_VERSION, MixedPrecision, PluginError, TensorParallelStyles, plugin_api
from titan_core.plan.resolve import resolve_config
from titan_core.plugin import discovery
from titan_core.testing.tiny_spec import TINY_SPEC
from titan_core.train import build

MAJOR, MINOR = (int(part) for part in PLUGIN_API_VERSION.split("."))
NEWER_MINOR = f"{MAJOR}.{MINOR + 1}"
NEXT_MAJOR = f"{MAJOR + 1}.0"

PLUGIN_MODULE = """
from dataclasses import dataclass
from torch import nn
from titan_core import TrainSpec

@dataclass
class Args:
    dim: int = 4

def spec(name, version):
    return TrainSpec(name=name, model_cls=nn.Linear, flavors={"debugmodel": Args()}, plugin_api_version=version)

VERSIONS = %r
for _name, _version in VERSIONS.items():
    globals()[_name] = spec(_name, _version)
"""


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A distribution titan-apiver 3.1.4 on sys.path (a dist-info folder, as pip writes one): one spec per
    declared API version, each a real entry point in titan.train_specs."""
    versions = {"same": PLUGIN_API_VERSION, "older_minor": f"{MAJOR}.0", "bare_major": f"{MAJOR}",
                "newer_minor": NEWER_MINOR, "next_major": NEXT_MAJOR, "not_a_version": "one"}
    (tmp_path / "titan_apiver.py").write_text(PLUGIN_MODULE % versions)
    info = tmp_path / "titan_apiver-3.1.4.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: titan-apiver\nVersion: 3.1.4\n")
    (info / "entry_points.txt").write_text("[titan.train_specs]\n" + "".join(
        f"{name} = titan_apiver:{name}\n" for name in versions))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setattr(discovery, "_loaded", {})
    monkeypatch.delitem(sys.modules, "titan_apiver", raising=False)
    return versions


def test_a_plugin_of_this_major_at_this_minor_or_older_is_served(installed: dict[str, str]) -> None:
    for name in ("same", "older_minor", "bare_major"):
        assert discovery.load_train_spec(name).plugin_api_version == installed[name]


@pytest.mark.parametrize(("name", "why"), [
    ("newer_minor", "the plugin may use what that newer API added"),
    ("next_major", f"titan-core {MAJOR}.x and {MAJOR + 1}.x are different contracts"),
    ("not_a_version", f'"one" is not a plugin API version: write MAJOR.MINOR, e.g. "{PLUGIN_API_VERSION}"'),
])
def test_an_api_the_core_cannot_serve_is_refused_with_one_message_naming_both(
        installed: dict[str, str], name: str, why: str) -> None:
    with pytest.raises(PluginError) as refused:
        discovery.load_train_spec(name)
    fix = (f"Install a version of titan-apiver built for plugin API {MAJOR}.0 to {PLUGIN_API_VERSION}, or a "
           f"titan-core that serves plugin API {installed[name]}." if name != "not_a_version" else
           f'Its plugin_api_version must be the API it was written for, e.g. "{PLUGIN_API_VERSION}": fix '
           f"titan-apiver, or install a version of it built for plugin API {MAJOR}.0 to {PLUGIN_API_VERSION}.")
    assert str(refused.value) == (
        f'spec "{name}" from titan-apiver 3.1.4 was written for titan-core plugin API {installed[name]}, but this '
        f"titan-core serves plugin API {PLUGIN_API_VERSION} ({why}). {fix}")
    health = discovery.health(discovery.discover(discovery.SPECS)[name][0])  # what --list shows as BROKEN
    assert health.error == str(refused.value)


def test_the_refusal_rule() -> None:
    served = ["1.0", "1.1", "1.2", "1.3", "1", "1.0.7", " 1.2 "]
    refused = ["1.4", "1.10", "2.0", "0.9", "", "1.x", "v1.0", "1.0.0.0", "١.٠"]
    assert [discovery.api_refusal(v) for v in served] == [None] * len(served)
    assert all(discovery.api_refusal(v) for v in refused)


# ---- resolved values ---------------------------------------------------------------------------


def _resolved(spec_fn: Any, *pairs: tuple[str, str]) -> Any:
    spec = dataclasses.replace(TINY_SPEC, name="contract_probe", parallelize_fn=spec_fn)
    discovery.register_train_spec(spec)
    return resolve_config(config_source=None, world_size=1, override_pairs=[
        ("model.spec", "contract_probe"), ("training.seq_len", "32"), *pairs])


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery, "_loaded", {})
    monkeypatch.setattr(discovery, "_registered", {discovery.SPECS: {}, discovery.CONVERTERS: {}})


@pytest.mark.parametrize(("pairs", "param_dtype", "compute"), [
    ((), "float32", torch.float32),  # param_dtype=auto (the default) with float32 compute on CPU
    ((("training.dtype", "bfloat16"),), "bfloat16", torch.bfloat16),
    ((("training.dtype", "bfloat16"), ("parallelism.param_dtype", "float32")), "float32", torch.bfloat16),
])
def test_parallelize_fn_of_api_1_0_gets_a_documented_param_dtype_and_1_1_gets_resolved_objects(
        probe: None, pairs: tuple[tuple[str, str], ...], param_dtype: str, compute: torch.dtype) -> None:
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # the 1.0 docs' pattern
    seen: dict[str, Any] = {}

    def old(model: torch.nn.Module, *, parallel_dims: Any, mesh: Any, training: Any, parallelism: Any,
            compile: Any, activation_checkpoint: Any, tp_styles: Any) -> torch.nn.Module:
        seen["old"] = table[parallelism.param_dtype]
        return model

    def new(model: torch.nn.Module, *, parallelism: Any, precision: MixedPrecision, device: torch.device,
            **rest: Any) -> torch.nn.Module:
        seen["new"] = (parallelism.param_dtype, precision, device, sorted(rest))
        return model

    def forwarding(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:  # a wrapper around a 1.0 function
        seen["forwarding"] = sorted(kwargs)
        return old(model, **kwargs)

    for fn in (old, new, forwarding):
        discovery._registered[discovery.SPECS].clear()
        discovery._loaded.clear()
        resolved = _resolved(fn, *pairs)
        assert resolved.config.parallelism.param_dtype == dict(pairs).get("parallelism.param_dtype", "auto")
        build.parallelize_part(resolved, torch.nn.Linear(2, 2), mesh=None, tp_styles=TensorParallelStyles.default())
    assert seen["old"] == table[param_dtype]
    assert seen["forwarding"] == ["activation_checkpoint", "compile", "mesh", "parallel_dims", "parallelism",
                                  "tp_styles", "training"]
    assert seen["new"] == (param_dtype, MixedPrecision(compute, table[param_dtype], torch.float32),
                           torch.device("cpu"), ["activation_checkpoint", "compile", "mesh", "parallel_dims",
                                                 "tp_styles", "training"])


def test_validate_fn_and_converters_receive_resolved_values(probe: None) -> None:
    seen: dict[str, Any] = {}

    def validate_1_0(args: Any, *, parallelism: Any, training: Any, world_size: int) -> None:
        seen["validate_1_0"] = parallelism.param_dtype

    def validate_1_1(args: Any, *, precision: MixedPrecision, device: torch.device, **rest: Any) -> None:
        seen["validate_1_1"] = (precision.param_dtype, device)

    for name, fn in (("a", validate_1_0), ("b", validate_1_1)):
        discovery.register_train_spec(dataclasses.replace(TINY_SPEC, name=name, validate_fn=fn))
        resolved = resolve_config(config_source=None, world_size=1, override_pairs=[
            ("model.spec", name), ("training.seq_len", "32"), ("training.dtype", "bfloat16")])
    assert seen == {"validate_1_0": "bfloat16", "validate_1_1": (torch.bfloat16, torch.device("cpu"))}
    job = build.run_context(resolved)
    assert job.parallelism.param_dtype == "bfloat16" and resolved.config.parallelism.param_dtype == "auto"
    assert job.precision == MixedPrecision(torch.bfloat16, torch.bfloat16, torch.float32)


def test_a_run_context_built_as_the_1_0_docs_show_holds_documented_values() -> None:
    from titan_core import CompileSection, ParallelismSection, RunContext, TrainingSection

    job = RunContext(torch.device("cpu"), "gloo", TrainingSection(), ParallelismSection(), CompileSection())
    assert ParallelismSection().param_dtype == "auto" and job.parallelism.param_dtype == "float32"
    assert job.precision == MixedPrecision(torch.float32, torch.float32, torch.float32)
    policy = job.precision.fsdp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.float32, torch.float32)


# ---- the public module -------------------------------------------------------------------------


def test_plugin_api_serves_every_name_it_lists_and_titan_core_the_same_objects() -> None:
    assert plugin_api.PLUGIN_API_VERSION == PLUGIN_API_VERSION == "1.3"
    assert set(plugin_api.__all__) == {"PLUGIN_API_VERSION", *plugin_api._WHERE}  # written out = the import block
    assert set(plugin_api.__all__) <= set(titan_core.__all__)
    for name in plugin_api.__all__:
        value = getattr(plugin_api, name)
        assert getattr(titan_core, name) is value, name
    assert f"version {PLUGIN_API_VERSION}" in (plugin_api.__doc__ or "")


def test_a_deprecated_name_still_works_with_a_warning() -> None:
    from titan_core.plugin import spec_factories

    for module in (plugin_api, spec_factories):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            legacy = module.LegacyFlopsPerTokenFn
        assert legacy is not None
        assert [w.category for w in caught] == [DeprecationWarning]
        assert "deprecated since titan-core plugin API 1.1; use FlopsPerTokenFn" in str(caught[0].message)
    with pytest.raises(AttributeError):
        plugin_api.NoSuchName  # noqa: B018


def test_the_frozen_plugins_are_unchanged() -> None:
    """tests/compat/third_party holds plugins as they were written for API 1.0: they are never edited to pass."""
    root = Path(__file__).parent / "third_party"
    listed = dict(line.split("  ", 1)[::-1] for line in (root / "SHA256SUMS").read_text().splitlines())
    present = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
               if p.is_file() and p.name != "SHA256SUMS" and "__pycache__" not in p.parts}
    assert present == listed
