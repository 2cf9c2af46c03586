"""Config sources, precedence, round trip, and every bad input's message (exit code 2)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from titan_core import ConfigError
from titan_core.plan.resolve import resolve_config

from conftest import assert_user_error


def resolve(*pairs: str, config: str | None = None, world_size: int = 1):
    split = [tuple(p.split("=", 1)) for p in pairs]
    return resolve_config(config_source=config, override_pairs=split, world_size=world_size).config  # type: ignore[arg-type]


def test_defaults_are_valid() -> None:
    c = resolve()
    assert c.model.spec == "llama3" and c.model.flavor == "debugmodel"
    assert c.training.steps == 200 and c.model.converters == []


@pytest.mark.parametrize("pairs, message", [
    (("parallelism.pp_microbatches=3", "training.local_batch_size=4"),
     "parallelism.pp_microbatches=3 does not divide training.local_batch_size=4. Choose a number of microbatches "
     "that divides the local batch."),
    (("training.local_batch_size=3",),
     "parallelism.pp_microbatches=2 does not divide training.local_batch_size=3. Choose a number of microbatches "
     "that divides the local batch (the default is the number of stages)."),
])
def test_microbatches_are_checked_once_by_the_core(pairs: tuple[str, ...], message: str) -> None:
    from titan_core import ConfigError

    with pytest.raises(ConfigError) as err:
        resolve("parallelism.pp=2", *pairs, world_size=2)
    assert message in str(err.value)


def test_pp_needs_a_spec_with_a_pipelining_fn() -> None:
    from titan_core import ConfigError
    from titan_core.testing import tiny_spec  # noqa: F401  (registers the spec "tiny", which has none)

    with pytest.raises(ConfigError, match='spec "tiny" has no pipelining_fn, so it cannot be split into pipeline '
                                          'stages, but parallelism.pp=2. Set parallelism.pp=1'):
        resolve("model.spec=tiny", "parallelism.pp=2", world_size=2)


def test_resolved_facts_are_derived_once() -> None:
    """Parallel degrees, device, backend, tokenizer and model args come with the resolved config."""
    r = resolve_config(config_source=None, override_pairs=[("parallelism.tp", "2"), ("training.seq_len", "64")],
                       world_size=4)
    assert (r.dims.dp_shard, r.dims.tp, r.dims.world_size) == (2, 2, 4)  # dp_shard=-1 filled
    assert (r.device.type, r.backend) == ("cpu", "gloo")  # "auto" resolved on this CPU machine
    assert r.model_args.vocab_size == r.tokenizer.vocab_size == 2048  # the builtin tokenizer's vocabulary
    assert r.model_shape_note is None  # the flavor's shape, no initial_load


def test_precedence_of_all_four_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """defaults < spec defaults < --config < flags, field by field."""
    import dataclasses

    from titan_core.plugin import discovery
    from titan_llama.spec import llama3_spec

    # a copy of llama3 claims the same Hugging Face model_type: keep it out of every later test
    monkeypatch.setitem(discovery._registered, discovery.SPECS, dict(discovery._registered[discovery.SPECS]))
    spec = dataclasses.replace(
        llama3_spec, name="llama3_prec",
        defaults={"training": {"steps": 11, "seq_len": 64, "seed": 5}},
        config_model=None,
    )
    discovery.register_train_spec(spec)
    toml = tmp_path / "run.toml"
    toml.write_text("[training]\nseq_len = 32\nseed = 6\n[model]\nspec = 'llama3_prec'\n")
    c = resolve("training.seed=7", config=str(toml))
    assert c.training.max_norm == 1.0  # field default
    assert c.training.steps == 11  # spec default
    assert c.training.seq_len == 32  # --config beats the spec
    assert c.training.seed == 7  # flag beats --config


def test_config_function_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "myconfigs.py").write_text(textwrap.dedent("""
        from titan_core import JobConfig, TrainingSection
        def small():
            return JobConfig(training=TrainingSection(steps=3, seq_len=16))
        def as_dict():
            return {"optimizer": {"lr": 0.5}}
        def broken():
            raise RuntimeError("no GPU budget")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    c = resolve("training.steps=4", config="myconfigs:small")
    assert (c.training.steps, c.training.seq_len) == (4, 16)
    assert c.training.local_batch_size == 8  # not set by the function: default kept
    assert resolve(config="myconfigs:as_dict").optimizer.lr == 0.5


def test_override_typing() -> None:
    c = resolve("optimizer.betas=0.8,0.9", "training.deterministic=true", "job.description=123",
                "parallelism.pp_split_points=layers.2,layers.4", "model.converters=")
    assert c.optimizer.betas == (0.8, 0.9)
    assert c.training.deterministic is True
    assert c.job.description == "123"
    assert c.parallelism.pp_split_points == ["layers.2", "layers.4"]


def test_print_config_round_trip(cli, tmp_path: Path) -> None:
    first = cli("--print-config", "--training.steps=7", "--optimizer.lr=0.01", "--converters", "float8")
    assert first.code == 0, first.text
    parsed = tomllib.loads(first.out)
    assert parsed["training"]["steps"] == 7 and parsed["model"]["converters"] == ["float8"]
    assert "float8" in parsed  # the converter's own section is printed too
    path = tmp_path / "printed.toml"
    path.write_text(first.out)
    second = cli("--print-config", "--config", str(path))
    assert second.code == 0, second.text
    assert second.out == first.out


def test_schema_has_core_and_requested_plugins(cli) -> None:
    import json

    result = cli("--schema", "--spec", "llama3", "--converters", "float8")
    assert result.code == 0, result.text
    schema = json.loads(result.out)
    assert {"training", "parallelism", "llama3", "float8"} <= set(schema["properties"])
    assert "mx" not in schema["properties"] and "qwen3" not in schema["properties"]
    # no spec named (several installed): the schema of every installed section
    everything = json.loads(cli("--schema").out)["properties"]
    assert {"llama3", "qwen3", "float8", "mx"} <= set(everything)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--trainig.steps=3"], ['unknown section "trainig"', 'Did you mean "training"']),
        (["--training.stpes=3"], ['unknown key "training.stpes"', 'Did you mean "steps"']),
        (["--training.steps=many"], ["training.steps", "valid integer"]),
        (["--training.steps=-5"], ["training.steps", "greater than 0"]),
        (["--training.steps=0"], ["training.steps", "greater than 0"]),
        (["--config", "does/not/exist.toml"], ["does/not/exist.toml", "no such file"]),
        (["--config", "no_such_module_xyz:fn"], ["no_such_module_xyz", "could not be imported"]),
        (["--spec", "lama3"], ['unknown spec "lama3"', 'Did you mean "llama3"', "llama3"]),
        (["--converters", "flaot8"], ['unknown converter "flaot8"', 'Did you mean "float8"']),
        (["--float8.recipe=rowwise"], ["[float8]", "not request", "--converters"]),
        (["--flavor", "9B"], ['no flavor "9B"', "debugmodel"]),
        (["--parallelism.tp=3"], ["world size"]),
        (["--converters", "float8,float8"], ["listed twice"]),
        (["--training.steps"], ["needs a value"]),
        (["stray"], ["unrecognised argument"]),
    ],
)
def test_bad_input_messages(cli, args: list[str], fragments: list[str]) -> None:
    assert_user_error(cli("--print-config", *args), *fragments)


def test_toml_syntax_error_names_the_line(cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[training]\nsteps = 3\nseed = = 4\n")
    assert_user_error(cli("--print-config", "--config", str(bad)), "bad.toml", "line 3")


def test_config_function_that_raises_and_missing_function(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cfgs2.py").write_text("def broken():\n    raise RuntimeError('no GPU budget')\ndef small():\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert_user_error(cli("--print-config", "--config", "cfgs2:broken"), "cfgs2:broken", "RuntimeError", "no GPU budget")
    assert_user_error(cli("--print-config", "--config", "cfgs2:smal"), "no function 'smal'", 'Did you mean "small"')


def test_traceback_flag_shows_the_traceback(cli) -> None:
    result = cli("--print-config", "--traceback", "--config", "no_such_module_xyz:fn")
    assert result.code == 2
    assert "Traceback (most recent call last)" in result.err


def test_misspelt_converter_key_is_named(cli) -> None:
    assert_user_error(cli("--print-config", "--converters", "float8", "--float8.recipee=rowwise"),
                      'unknown key "float8.recipee"', 'Did you mean "recipe"')


@pytest.mark.parametrize("pairs, toml, message", [
    (("training.steps=true",), None, "training.steps = true is a boolean, but training.steps takes a number; "
                                     "give one (e.g. training.steps=200)."),
    ((), "[optimizer]\nlr = false\n", "optimizer.lr = false is a boolean, but optimizer.lr takes a number"),
    (("llama3.n_layers=true",), None, "llama3.n_layers = true is a boolean, but llama3.n_layers takes a number"),
    ((), '[data.mix.web]\nsource = "builtin"\nweight = true\n',
     "data.mix.web.weight = true is a boolean, but data.mix.web.weight takes a number"),
])
def test_a_boolean_where_a_number_is_wanted_is_refused(tmp_path: Path, pairs: tuple[str, ...], toml: str | None,
                                                       message: str) -> None:
    # pydantic's lax mode would read true as 1 and false as 0: `steps = true` would train one step.
    config = None
    if toml is not None:
        (tmp_path / "c.toml").write_text(toml)
        config = str(tmp_path / "c.toml")
    with pytest.raises(ConfigError) as caught:
        resolve(*pairs, config=config)
    assert str(caught.value).startswith(message), caught.value


def test_booleans_still_set_boolean_fields_and_numbers_still_set_numbers() -> None:
    c = resolve("checkpoint.enable=true", "training.steps=3", "optimizer.lr=0.01", "validation.enable=false")
    assert c.checkpoint.enable is True and c.validation.enable is False
    assert c.training.steps == 3 and c.optimizer.lr == 0.01
