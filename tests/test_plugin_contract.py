"""The typed plugin contract at run time: ModelConverter[Config], old-style converters, the
tokenizer's optional extras. (The static side, that the core's defaults satisfy the factory
Protocols, is checked by mypy over src/titan_core/testing/contract_check.py in CI.)"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import pytest
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from titan_core import ConfigError, EmptyConfig, ModelConverter, ParallelDims
from titan_core.data.packing import clear_cache, pack_documents, tokenized_source
from titan_core.plan.tokenizer import build_tokenizer
from titan_core.plugin import discovery
from titan_core.train.converters import apply_converters

DIMS = ParallelDims.resolve(dp_replicate=1, dp_shard=1, tp=1, pp=1, world_size=1)
TOK = build_tokenizer("builtin")


class PickConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    names: list[str] = []
    scale: float = 1.0


class OtherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Picks:
    """select/convert shared by the converters below: pick the named linears, scale their weights."""

    config: Any

    def select(self, model: nn.Module) -> list[str]:
        return list(self.config.names)

    def convert(self, model: nn.Module, fqns: list[str]) -> None:
        for fqn in fqns:
            model.get_submodule(fqn).register_buffer("scale", torch.tensor(self.config.scale))


class GenericPick(_Picks, ModelConverter[PickConfig]):
    pass


class OldStylePick(_Picks, ModelConverter):
    """Written for plugin API 1.0 before the generic: Config set, self.config restated."""

    Config = PickConfig

    def __init__(self, config: Any, *, parallel_dims: ParallelDims, job: Any) -> None:
        super().__init__(config, parallel_dims=parallel_dims, job=job)
        self.config: PickConfig


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))


def test_type_argument_sets_config_and_validates_dicts() -> None:
    assert GenericPick.Config is PickConfig
    conv = GenericPick({"names": ["1"], "scale": 2.0}, parallel_dims=DIMS, job=None)  # type: ignore[arg-type]
    assert isinstance(conv.config, PickConfig)
    assert conv.config.names == ["1"] and conv.config.scale == 2.0
    with pytest.raises(ValueError, match="unknown"):
        GenericPick({"unknown": 1}, parallel_dims=DIMS, job=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [GenericPick, OldStylePick])
def test_generic_and_old_style_converters_run_the_same_pipeline(cls: type[ModelConverter[Any]]) -> None:
    model = _model()
    conv = cls(PickConfig(names=["1"], scale=3.0), parallel_dims=DIMS, job=None)  # type: ignore[arg-type]
    table = apply_converters(model, [("pick", conv)], None)
    assert table.modules_of("pick") == ["1"]
    assert float(model.get_submodule("1").scale) == 3.0
    assert not hasattr(model.get_submodule("0"), "scale")


class SetUpPick(_Picks, ModelConverter[PickConfig]):
    """Prepares in ``setup()``: no constructor of its own."""

    calls: list[tuple[float, ParallelDims, object]] = []

    def setup(self) -> None:
        type(self).calls.append((self.config.scale, self.parallel_dims, self.job))
        if self.config.scale <= 0:
            raise ConfigError(f"pick.scale is {self.config.scale}; give a positive number")


def test_setup_runs_once_after_the_config_is_validated_and_its_error_reaches_the_caller() -> None:
    SetUpPick.calls.clear()
    job = object()
    conv = SetUpPick({"names": ["0"], "scale": 2.5}, parallel_dims=DIMS, job=job)  # type: ignore[arg-type]
    # A dict became the validated config before setup() saw it, with the dims and the job already set.
    assert SetUpPick.calls == [(2.5, DIMS, job)] and isinstance(conv.config, PickConfig)
    with pytest.raises(ConfigError, match=r"^pick.scale is -1.0; give a positive number$"):
        SetUpPick({"scale": -1}, parallel_dims=DIMS, job=job)  # type: ignore[arg-type]
    assert len(SetUpPick.calls) == 2
    model = _model()
    apply_converters(model, [("pick", conv)], None)
    assert float(model.get_submodule("0").scale) == 2.5


def test_old_style_converter_through_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discovery, "_loaded", {})
    monkeypatch.setattr(discovery, "_registered", {discovery.SPECS: {}, discovery.CONVERTERS: {}})
    discovery.register_model_converter("oldpick", OldStylePick)
    discovery.register_model_converter("newpick", GenericPick)
    assert discovery.load_converter("oldpick") is OldStylePick
    assert discovery.load_converter("newpick").Config is PickConfig


def test_plain_subclass_without_config_keeps_the_empty_config() -> None:
    class Bare(_Picks, ModelConverter):
        pass

    class AnyTyped(_Picks, ModelConverter[Any]):  # no config type given: Config as set in the class
        Config = PickConfig

    assert Bare.Config is EmptyConfig
    assert AnyTyped.Config is PickConfig


def test_subclass_of_a_generic_converter_inherits_its_config() -> None:
    class Tuned(GenericPick):
        pass

    assert Tuned.Config is PickConfig
    assert Tuned({"names": ["0"]}, parallel_dims=DIMS, job=None).config.names == ["0"]  # type: ignore[arg-type]


def test_generic_intermediate_base_takes_its_config_from_the_concrete_class() -> None:
    C = TypeVar("C", bound=BaseModel)

    class Base(_Picks, ModelConverter[C], Generic[C]):
        pass

    class Concrete(Base[PickConfig]):
        pass

    assert Base.Config is EmptyConfig
    assert Concrete.Config is PickConfig


def test_type_argument_and_a_different_config_is_an_error() -> None:
    with pytest.raises(TypeError, match=r"subclasses ModelConverter\[PickConfig\] but sets Config = OtherConfig"):
        class Twice(_Picks, ModelConverter[PickConfig]):
            Config = OtherConfig

    class Same(_Picks, ModelConverter[PickConfig]):  # saying it twice, the same way, is harmless
        Config = PickConfig

    assert Same.Config is PickConfig


def test_type_argument_must_be_a_pydantic_model() -> None:
    with pytest.raises(TypeError, match="must be the converter's config, a pydantic BaseModel subclass"):
        class NotAModel(_Picks, ModelConverter[dict]):  # type: ignore[type-var]
            pass


class PlainTokenizer:
    """Only the Tokenizer protocol: no encode_batch, no fingerprint."""

    vocab_size, bos_id, eos_id = TOK.vocab_size, TOK.bos_id, TOK.eos_id

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        self.calls += 1
        return TOK.encode(text, bos=bos, eos=eos)

    def decode(self, ids: Any) -> str:
        return TOK.decode(ids)


class BatchTokenizer(PlainTokenizer):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def encode_batch(self, texts: list[str], *, num_threads: int = 4) -> list[list[int]]:
        self.batches.append(len(texts))
        return [TOK.encode(t) for t in texts]


DOCS = ["alpha beta", "gamma", "delta epsilon zeta"]
EXPECTED = [tok for d in DOCS for tok in TOK.encode(d, bos=True, eos=True)]


def test_packing_uses_encode_batch_when_offered_and_encode_otherwise() -> None:
    plain, batched = PlainTokenizer(), BatchTokenizer()
    assert pack_documents(DOCS, plain).tokens.tolist() == EXPECTED
    assert plain.calls == len(DOCS)
    assert pack_documents(DOCS, batched, chunk_docs=2).tokens.tolist() == EXPECTED
    assert batched.batches == [2, 1] and batched.calls == 0


def test_stream_cache_is_keyed_on_the_fingerprint_else_on_the_object(tmp_path: Any) -> None:
    source = tmp_path / "docs.txt"
    source.write_text("\n\n".join(DOCS))
    clear_cache()
    try:
        a, b = PlainTokenizer(), PlainTokenizer()
        first = tokenized_source(str(source), a, text_field="text", hf_split="train", allow_download=False)
        assert tokenized_source(str(source), a, text_field="text", hf_split="train", allow_download=False) is first
        # No fingerprint: another object is another vocabulary as far as the cache knows.
        assert tokenized_source(str(source), b, text_field="text", hf_split="train", allow_download=False) is not first
        # The same fingerprint (same vocabulary, another object) shares the entry.
        one = tokenized_source(str(source), TOK, text_field="text", hf_split="train", allow_download=False)
        clone = type(TOK)(TOK.mergeable_ranks, special_tokens=TOK.special_tokens, pattern=TOK.pattern)
        assert clone is not TOK and clone.fingerprint == TOK.fingerprint
        assert tokenized_source(str(source), clone, text_field="text", hf_split="train", allow_download=False) is one
    finally:
        clear_cache()


def test_a_model_without_init_parameter_is_told_what_the_contract_wants(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A model written for another trainer (init_weights, no init_parameter): one message naming the method."""
    import dataclasses

    from titan_core import register_train_spec
    from titan_core.testing.tiny_spec import TINY_SPEC, TinyTransformer

    class InitWeightsOnly(TinyTransformer):
        def __getattribute__(self, name: str) -> Any:
            if name == "init_parameter":
                raise AttributeError(name)
            return super().__getattribute__(name)

    monkeypatch.setitem(discovery._registered, discovery.SPECS, dict(discovery._registered[discovery.SPECS]))
    register_train_spec(dataclasses.replace(TINY_SPEC, name="contract_no_init", model_cls=InitWeightsOnly))
    result = cli("--spec", "contract_no_init", "--training.steps=1", f"--job.run_dir={tmp_path / 'run'}")
    assert result.code == 2, result.text
    assert "Traceback" not in result.text
    assert "model class InitWeightsOnly has no init_parameter(fqn, tensor, generator) method" in result.err
    assert "docs/writing-a-train-spec.md, section 4" in result.err


@pytest.mark.parametrize(("flavors", "fragment"), [
    ({"debugmodel": {"dim": 64}}, 'flavor "debugmodel" (dict) is not a dataclass instance'),
    ({"debugmodel": EmptyConfig()}, 'flavor "debugmodel" (EmptyConfig) is not a dataclass instance'),
    ({"debugmodel": "TinyArgs"}, 'flavor "debugmodel" (str) is not a dataclass instance'),
    ({}, "flavors is dict {}; it must map flavor names to the model's args"),
], ids=["dict", "pydantic", "str", "empty"])
def test_flavors_that_are_not_dataclass_instances_are_one_clear_error(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, flavors: dict[str, Any], fragment: str
) -> None:
    import dataclasses

    from titan_core import register_train_spec
    from titan_core.testing.tiny_spec import TINY_SPEC, TinyArgs

    monkeypatch.setitem(discovery._registered, discovery.SPECS, dict(discovery._registered[discovery.SPECS]))
    register_train_spec(dataclasses.replace(TINY_SPEC, name="contract_flavors", flavors=flavors))
    register_train_spec(dataclasses.replace(TINY_SPEC, name="contract_flavor_class", flavors={"debugmodel": TinyArgs}))
    result = cli("--spec", "contract_flavors", "--training.steps=1", f"--job.run_dir={tmp_path / 'run'}")
    assert result.code == 2 and "Traceback" not in result.text, result.text
    assert f'spec "contract_flavors": {fragment}' in result.err
    result = cli("--spec", "contract_flavor_class", "--dry-run", f"--job.run_dir={tmp_path / 'run2'}")
    assert result.code == 2 and 'flavor "debugmodel" (the class TinyArgs) is not a dataclass instance' in result.err
