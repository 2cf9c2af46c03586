"""Hostile inputs, wave 9: the dry run's cluster flags (a --target-device size that rounds to no byte divided
the plan by zero; a --target-device beside --rehearse-rank was ignored), pipeline split points that int()
refuses, numbers in a Hugging Face config.json beyond what Python converts (an integer beyond any float, an
integer of over 4,300 digits) or than the model takes (a deepseek yarn context of 10^12), and third-party
plugins whose plugin_api_version is not a string, whose spec factory raises or exits, whose repr() raises, or
whose import never returns.

Most cases run a CLI's ``main`` (or the one function the CLI calls) in this process; the hung import runs in a
process of its own, bounded by a subprocess timeout. ``pytest -s`` prints the table of (case, exit code, message).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import hostile_harness as harness
import pytest

from titan_core.errors import ConfigError, PluginError
from titan_core.plugin import discovery

from conftest import CliResult

TABLE: list[tuple[str, int, str]] = []
table = harness.table_printer(TABLE, "input (wave 9)")
DRY = ("--spec", "llama3", "--flavor", "debugmodel", "--training.seq_len=32", "--training.local_batch_size=2",
       "--dry-run")
# An integer of 5,001 digits: JSON allows it; Python's int() refuses strings of over 4,300 digits.
HUGE_DIGITS = "1" + "0" * 5000
# An integer beyond any float (float() and math.isfinite raise OverflowError), but short enough for int().
BEYOND_FLOAT = 10**400


def record(case: str, result: CliResult) -> None:
    TABLE.append((case, result.code, harness.first_error_line(result)))


def titan_train(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> CliResult:
    harness.isolate(monkeypatch)
    return harness.run_in_process(capsys, *args)


# ---- --target-device and --rehearse-rank ---------------------------------------------------------------------


@pytest.mark.parametrize("size", ["1e-10GiB", "0.0000001G", "1e-6GB"])
def test_a_target_device_smaller_than_a_mebibyte_is_refused(size: str, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the size became 0 bytes and the plan ended with ZeroDivisionError (peak / device memory)."""
    result = titan_train(capsys, monkeypatch, *DRY, "--nproc-per-node", "2", "--target-device", size)
    record(f"--dry-run --target-device {size} (ZeroDivisionError)", result)
    harness.assert_one_clean_error(result, f"--target-device {size}: less memory than any accelerator has (under "
                                           f"1 MiB); give the memory of one device, e.g. --target-device 80GiB.")


def test_a_small_but_real_target_device_size_is_still_planned(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard of the floor (passes before the change too): 0.001 GiB (1 MiB and a bit) is a device, too small."""
    from titan_core.train.target_devices import parse_target_device

    assert parse_target_device("0.001GiB").memory_bytes == int(0.001 * 2**30)
    result = titan_train(capsys, monkeypatch, *DRY, "--nproc-per-node", "2", "--target-device", "0.001GiB")
    assert result.code == 2 and "the planned run does not fit" in result.text, result.text
    assert "Traceback" not in result.text


def test_a_target_device_beside_rehearse_rank_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: accepted and ignored (exit 0): the rehearsal measured this machine, its figures read as an H100's."""
    result = titan_train(capsys, monkeypatch, *DRY[:-1], "--training.steps=1", "--nproc-per-node", "2",
                         "--rehearse-rank", "1", "--target-device", "H100", f"--job.run_dir={tmp_path / 'run'}")
    record("--rehearse-rank 1 --target-device H100 (ignored, exit 0)", result)
    harness.assert_one_clean_error(result, "--target-device H100 is for --dry-run's plan; --rehearse-rank trains on "
                                           "this machine's device and measures its memory")
    assert "or plan with --dry-run --target-device H100." in result.text
    assert not (tmp_path / "run").exists()


def test_a_moe_model_with_an_aux_loss_is_planned_over_pipeline_stages(capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the activation probe's forward left the MoE blocks' aux_loss (a non-leaf tensor) on the model, the
    pipeline split deep-copied it, and torch's refusal was reported as a failure of titan-core's own code (exit 2)."""
    result = titan_train(capsys, monkeypatch, "--spec", "deepseek_v3", "--flavor", "debugmoe", *DRY[4:],
                         "--nproc-per-node", "2", "--parallelism.pp=2")
    record("deepseek_v3 debugmoe --parallelism.pp=2 --dry-run (refused: deepcopy of a non-leaf tensor)", result)
    assert result.code == 0, result.text
    assert "dry run: configuration valid; nothing trained" in result.text and "Traceback" not in result.text


# ---- parallelism.pp_split_points -----------------------------------------------------------------------------


@pytest.mark.parametrize("number", ["\u00b3", "\u0663", "9" * 5000], ids=["superscript 3", "Arabic-Indic 3", "5000 digits"])
def test_a_split_point_int_refuses_is_named_as_a_bad_split_point(number: str, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: isdigit() let "³" and a 5,000-digit number through to int(), whose ValueError was reported as a
    failure of titan-core's own code ("report it to titan-core"); the Arabic-Indic 3 was read as layer 3."""
    point = f"layers.{number}"
    result = titan_train(capsys, monkeypatch, *DRY, "--nproc-per-node", "2", "--parallelism.pp=2",
                         f"--parallelism.pp_split_points={json.dumps([point])}")
    record(f"pp_split_points [layers.{number[:8]}] (core's own failure)", result)
    harness.assert_one_clean_error(result, "parallelism.pp_split_points: ")
    assert 'is not a layer that can start a stage; use "layers.K" with 1 <= K <= 5.' in result.text
    assert "titan-core's own code" not in result.text


# ---- Hugging Face config.json: numbers beyond what Python converts -------------------------------------------


def deepseek_config() -> dict[str, Any]:
    import dataclasses

    from titan_deepseek.flavors import deepseek_v3_flavors
    from titan_deepseek.hf_adapter import DeepSeekV3StateDictAdapter

    return DeepSeekV3StateDictAdapter().hf_config(dataclasses.replace(deepseek_v3_flavors["debugmoe"], vocab_size=256))


@pytest.mark.parametrize("key", ["routed_scaling_factor", "rms_norm_eps"])
def test_a_deepseek_float_field_beyond_any_float_is_named(key: str) -> None:
    """Before: math.isfinite raised OverflowError, reported as a failure of titan-core's own code."""
    from titan_deepseek.hf_adapter import DeepSeekV3StateDictAdapter

    config = {**deepseek_config(), key: BEYOND_FLOAT}
    with pytest.raises(ConfigError, match=rf"config\.json sets what the deepseek_v3 spec cannot express: {key}=1000"):
        DeepSeekV3StateDictAdapter().model_args_from_hf(config)


@pytest.mark.parametrize(("edit", "named"), [
    ({"original_max_position_embeddings": BEYOND_FLOAT}, "original_max_position_embeddings=1000"),
    ({"original_max_position_embeddings": 10**12}, "original_max_position_embeddings=1000000000000 (a whole number "
                                                   "from 1 to 10,000,000)"),
    ({"truncate": "false"}, "truncate='false' (true or false)"),
], ids=["original beyond any float", "original 1e12", "truncate 'false'"])
def test_a_deepseek_yarn_field_out_of_range_is_named(edit: dict[str, Any], named: str) -> None:
    """Before: converted (exit 0); the first made titan-generate on the folder end with an OverflowError traceback
    (the rotary table takes a logarithm of it), and bool("false") read the string as true."""
    from titan_deepseek.hf_adapter import DeepSeekV3StateDictAdapter

    config = deepseek_config()
    for field in ("rope_parameters", "rope_scaling"):  # both spellings, equal: titan's own export writes both
        config[field] = {**config[field], **edit}
    with pytest.raises(ConfigError, match="config.json sets what the deepseek_v3 spec cannot express: ") as refused:
        DeepSeekV3StateDictAdapter().model_args_from_hf(config)
    assert named in str(refused.value)
    # the guard: the flavor's own yarn fields (an original context of 512, truncate true) still read
    args = DeepSeekV3StateDictAdapter().model_args_from_hf(deepseek_config())
    assert (args.rope_original_max_seq_len, args.rope_truncate) == (512, True)


@pytest.mark.parametrize(("spec", "key", "said"), [
    ("qwen3", "head_dim", "head_dim=4611686018427387904 (an even whole number up to 65,536)"),
    ("deepseek_v3", "qk_nope_head_dim", "qk_nope_head_dim=4611686018427387904 (more than 65,536)"),
    ("deepseek_v3", "qk_rope_head_dim", "qk_rope_head_dim=4611686018427387904 (more than 65,536)"),
    ("deepseek_v3", "v_head_dim", "v_head_dim=4611686018427387904 (more than 65,536)"),
    ("deepseek_v3", "n_shared_experts", "n_shared_experts=4611686018427387904 (more than 4,096)"),
])
def test_a_head_size_no_model_has_is_named_before_the_model_is_built(spec: str, key: str, said: str) -> None:
    """2**62 had no bound: the adapter accepted it, and building the (meta) model failed in torch ("Overflow when
    unpacking long long"), reported by titan-convert from-hf and titan-generate as titan-core's own failure."""
    import dataclasses

    if spec == "qwen3":
        from titan_qwen3.flavors import qwen3_flavors as flavors
        from titan_qwen3.hf_adapter import Qwen3StateDictAdapter as Adapter
    else:
        from titan_deepseek.flavors import deepseek_v3_flavors as flavors
        from titan_deepseek.hf_adapter import DeepSeekV3StateDictAdapter as Adapter
    adapter = Adapter()
    config = adapter.hf_config(dataclasses.replace(flavors["debugmoe"], vocab_size=256))
    adapter.model_args_from_hf(config)  # the guard: the flavor's own sizes read
    with pytest.raises(ConfigError, match=f"config.json sets what the {spec} spec cannot express: ") as refused:
        adapter.model_args_from_hf({**config, key: 2**62})
    assert said in str(refused.value)


def test_a_llama_rope_theta_beyond_any_float_is_named() -> None:
    """The llama adapter's own check of positive numbers had the same OverflowError."""
    import dataclasses

    from titan_llama.flavors import llama3_flavors
    from titan_llama.hf_adapter import LlamaStateDictAdapter

    adapter = LlamaStateDictAdapter()
    config = adapter.hf_config(dataclasses.replace(llama3_flavors["debugmodel"], vocab_size=256))
    config.pop("rope_parameters", None)
    config["rope_theta"] = BEYOND_FLOAT
    with pytest.raises(ConfigError, match=r"rope_theta=1000\d+ \(a positive number\)"):
        adapter.model_args_from_hf(config)


def test_rope_fields_that_differ_by_an_integer_beyond_any_float_are_named() -> None:
    """check_rope_fields compares rope_parameters' rope_theta with the top-level one: OverflowError before."""
    from titan_core.hf.rope_fields import check_rope_fields

    config = {"rope_theta": BEYOND_FLOAT, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    with pytest.raises(ConfigError, match=r"sets rope_theta=1000\d+ but rope_parameters\.rope_theta=10000\.0"):
        check_rope_fields(config, Path("config.json"), what="from-hf")
    # the guard: equal values (titan's own exports write both) still pass
    check_rope_fields({"rope_theta": 10000, "rope_parameters": {"rope_theta": 10000.0}}, Path("c"), what="from-hf")


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("value", ["yarn", [1], 4.0])
def test_rope_settings_that_are_not_an_object_are_named(key: str, value: Any) -> None:
    """qwen3's adapter read a rope_scaling of "yarn" or [1] as plain RoPE (it reads keys only from an object):
    a folder of another model converted without a word. Every spec's folder reader checks the fields."""
    from titan_core.hf.rope_fields import check_rope_fields

    with pytest.raises(ConfigError, match=rf"sets {key}=.* which is not a JSON object\. RoPE settings are an object"):
        check_rope_fields({key: value}, Path("config.json"), what="from-hf")
    for absent in (None, {}):  # the guard: null or an empty object is plain RoPE, as transformers reads it
        check_rope_fields({key: absent, "rope_theta": 10000.0}, Path("config.json"), what="from-hf")


def hf_folder_with(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    for name, text in files.items():
        (folder / name.replace("__", ".")).write_text(text)
    return folder


@pytest.mark.parametrize(("files", "fragment"), [
    pytest.param({"config__json": f'{{"model_type": "llama", "hidden_size": {HUGE_DIGITS}}}'},
                 "config.json: Exceeds the limit (4300 digits) for integer string conversion", id="config.json"),
    pytest.param({"config__json": '{"model_type": "llama"}',
                  "model__safetensors__index__json": f'{{"metadata": {{"total_size": {HUGE_DIGITS}}}}}'},
                 "model.safetensors.index.json is not a safetensors index", id="index"),
])
def test_a_number_of_5000_digits_in_an_hf_folder_is_one_clean_error(files: dict[str, str], fragment: str,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Before: json's int() raised a plain ValueError, which the folder's reader did not catch: titan-convert
    from-hf ended with a traceback and exit 1."""
    from titan_core.commands.convert import main as convert_main

    folder = hf_folder_with(tmp_path, **files)
    before = harness.snapshot(folder)
    result = harness.tool(capsys, convert_main, "from-hf", "--spec", "llama3", str(folder), str(tmp_path / "out"))
    record(f"from-hf: {next(iter(files)).replace('__', '.')} holding a 5001-digit number (traceback, exit 1)", result)
    harness.assert_one_clean_error(result, fragment)
    harness.assert_unchanged(before, folder)
    assert not (tmp_path / "out").exists()


def test_a_number_of_5000_digits_in_a_tokenizer_json_or_a_config_copy_is_a_config_error(tmp_path: Path) -> None:
    """The two other readers of a Hugging Face folder's JSON: data.tokenizer's tokenizer.json, and the copy of
    config.json a from-hf checkpoint carries (checkpoint.initial_load)."""
    from titan_core.hf.tokenizer_folder import load_tokenizer_folder
    from titan_core.weights.shape import read_json_object

    folder = tmp_path / "tok"
    (folder / "original").mkdir(parents=True)
    builtin = Path(importlib.import_module("titan_core").__file__ or "").parent / "assets" / "builtin_tokenizer.model"
    shutil.copyfile(builtin, folder / "original" / "tokenizer.model")
    (folder / "tokenizer.json").write_text(f'{{"added_tokens": [{{"id": {HUGE_DIGITS}}}]}}')
    with pytest.raises(ConfigError, match=r"data\.tokenizer: cannot read .*tokenizer\.json: Exceeds the limit"):
        load_tokenizer_folder(folder)
    (tmp_path / "config.json").write_text(f'{{"vocab_size": {HUGE_DIGITS}}}')
    with pytest.raises(ConfigError, match=r"cannot read .*config\.json: Exceeds the limit"):
        read_json_object(tmp_path / "config.json", unreadable="cannot read {path}: {exc}", not_object="{path}")


# ---- third-party plugins: plugin_api_version that is not a string, an import that never returns --------------

ODD_MODULE = """
from dataclasses import dataclass
from torch import nn
from titan_core import TrainSpec

@dataclass
class Args:
    dim: int = 4

class RaisingStr:
    def __str__(self):
        raise RuntimeError("__str__ bug on purpose")

def spec(name, version):
    return TrainSpec(name=name, model_cls=nn.Linear, flavors={"debugmodel": Args()}, plugin_api_version=version)

float_version = spec("float_version", 1.10)
none_version = spec("none_version", None)
raising_version = spec("raising_version", RaisingStr())
long_version = spec("long_version", "1." + "0" * 5000)
good_version = spec("good_version", "1.0")

def factory_raises():
    raise ValueError("factory bug on purpose")

def factory_exits():
    raise SystemExit(0)

class RaisingRepr:
    def __repr__(self):
        raise RuntimeError("__repr__ bug on purpose")

raising_repr = RaisingRepr()
"""
ODD_SPECS = ("float_version", "none_version", "raising_version", "long_version", "factory_raises", "factory_exits",
             "good_version")


def install(site: Path, dist: str, module: str, source: str, entry_points: str) -> None:
    """A distribution on ``site`` as pip writes one: the module and a dist-info folder with its entry points."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def odd_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path / "site", "titan-oddver", "titan_oddver", ODD_MODULE,
            "[titan.train_specs]\n" + "".join(f"{name} = titan_oddver:{name}\n" for name in ODD_SPECS)
            + "[titan.model_converters]\nraising_repr = titan_oddver:raising_repr\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setattr(discovery, "_loaded", {})
    monkeypatch.delitem(sys.modules, "titan_oddver", raising=False)


@pytest.mark.parametrize(("name", "declared"), [("float_version", "float"), ("none_version", "NoneType"),
                                                ("raising_version", "RaisingStr")])
def test_a_plugin_api_version_that_is_not_a_string_is_refused(odd_plugins: None, name: str, declared: str) -> None:
    """Before: str() of it was compared: 1.10 (a float) passed as API "1.1", None was quoted as "None", and a
    __str__ that raised ended the load (and titan-train --list) with a traceback."""
    with pytest.raises(PluginError) as refused:
        discovery.load_train_spec(name)
    assert str(refused.value) == (
        f'spec "{name}" from titan-oddver 0.1 declares its plugin_api_version as a {declared}, not a string. Its '
        f'plugin_api_version must be the API it was written for as text, e.g. "{discovery.PLUGIN_API_VERSION}": '
        f"fix titan-oddver, or install a version of it built for plugin API 1.0 to {discovery.PLUGIN_API_VERSION}.")


def test_a_plugin_api_version_of_5000_digits_is_refused_and_quoted_short(odd_plugins: None) -> None:
    """Before: int() of the 5,000-digit minor raised ValueError (a traceback)."""
    with pytest.raises(PluginError) as refused:
        discovery.load_train_spec("long_version")
    message = str(refused.value)
    assert 'is not a plugin API version: write MAJOR.MINOR, e.g. "' in message
    assert "written for titan-core plugin API 1.00000000000000000000000000000000000000... (5,002 characters)" in message
    assert len(message) < 800, message


@pytest.mark.parametrize(("name", "raised"), [("factory_raises", "ValueError: factory bug on purpose"),
                                              ("factory_exits", "SystemExit: 0")])
def test_a_spec_factory_that_raises_or_exits_is_the_plugin_s_error(odd_plugins: None, name: str, raised: str,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry point may name a zero-argument factory of the spec. Before: what it raised was a traceback (exit 1),
    and its sys.exit(0) ended titan-train quietly with exit 0, having done nothing."""
    result = titan_train(capsys, monkeypatch, "--spec", name, "--dry-run")
    record(f"--spec {name}: a factory that raises {raised.split(':')[0]} (traceback / silent exit 0)", result)
    harness.assert_one_clean_error(result, f'spec "{name}" failed when its factory was called: entry point '
                                           f'"{name} = titan_oddver:{name}" of titan-oddver 0.1 raised {raised}. '
                                           f"Reinstall or fix titan-oddver")


def test_a_converter_entry_point_with_a_raising_repr_is_named_by_its_type(odd_plugins: None) -> None:
    """Before: the refusal quoted repr() of what the entry point named; a repr that raised was a traceback."""
    with pytest.raises(PluginError, match=r'^converter "raising_repr" resolved to RaisingRepr, not a '
                                          r"titan_core\.ModelConverter subclass\.$"):
        discovery.load_converter("raising_repr")


def test_list_shows_each_odd_version_as_broken_and_exits_0(odd_plugins: None, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    result = titan_train(capsys, monkeypatch, "--list")
    record("titan-train --list with plugin_api_version 1.10, None, a raising __str__, 5000 digits, factories that "
           "raise or exit (traceback; cut short with exit 0)", result)
    assert result.code == 0 and "Traceback" not in result.text, result.text
    rows = {line.split()[0]: line for line in result.out.splitlines() if line.startswith("  ")}
    assert all("BROKEN: " in rows[name] for name in ODD_SPECS[:-1]), result.out
    assert rows["good_version"].endswith("(plugin API 1.0)"), result.out  # the guard: a good one is served
    assert "BROKEN: " in rows["raising_repr"] and "float8" in rows, result.out


HUNG_MODULE = "import time\ntime.sleep(600)  # waits for a server that never answers\n"
# titan-train with model.plugin_timeout_s's default lowered to 2 s (the run's config is not read when plugins load)
IMPATIENT = ("import sys\nfrom titan_core.plugin import guard\nguard.set_plugin_timeout(2.0)\n"
             "from titan_core.commands.titan_train import main\nsys.exit(main(sys.argv[1:]))\n")


@pytest.mark.parametrize("args", [("--spec", "llama3", "--converters", "hung", "--dry-run"), ("--list",)],
                         ids=["run", "--list"])
def test_a_plugin_whose_import_never_returns_is_named_instead_of_hanging(args: tuple[str, ...],
                                                                        tmp_path: Path) -> None:
    """Before: titan-train waited for ever (no deadline around the import; model.plugin_timeout_s bounded calls
    only after loading). The process is given 60 s."""
    install(tmp_path / "site", "titan-hung", "titan_hung", HUNG_MODULE,
            "[titan.model_converters]\nhung = titan_hung:Converter\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    for name in harness.LAUNCHER_ENV:
        env.pop(name, None)
    try:
        proc = subprocess.run([sys.executable, "-c", IMPATIENT, *args], capture_output=True, text=True, timeout=60,
                              env=env, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"titan-train {' '.join(args)} still waited on the import after 60 s")
    result = CliResult(proc.returncode, proc.stdout, proc.stderr)
    record(f"titan-train {' '.join(args)} with a converter whose import never returns (hangs)", result)
    said = ('converter "hung" (titan-hung 0.1) did not finish loading within 2 s: entry point "hung = '
            'titan_hung:Converter" hangs (waits for something that never comes, or loops). Report it to the authors '
            "of titan-hung, or disable it with TITAN_DISABLE_PLUGINS=titan-hung.")
    if args == ("--list",):
        assert result.code == 0 and f"BROKEN: {said}" in result.out, result.text
        assert "float8" in result.out  # the plugins after it are listed too
    else:
        harness.assert_one_clean_error(result, f"titan-train: error: {said}")
    assert "Traceback" not in result.text


# ---- titan-plugin check: its own --spec and --flavor ---------------------------------------------------------


@pytest.mark.parametrize(("args", "said"), [
    (("float8", "--spec", "lama3"), '--spec lama3: no installed spec is named "lama3". Did you mean "llama3"? '
                                    "Converters are trained on the core's tiny model (the default, --spec tiny)"),
    (("float8", "--flavor", "nosuch"), '--flavor nosuch: spec "tiny" has no flavor "nosuch". Its flavors: debugmodel.'),
    (("llama3", "--flavor", "debugmodle"), '--flavor debugmodle: spec "llama3" has no flavor "debugmodle". Did you '
                                           'mean "debugmodel"? Its flavors: debugmodel, '),
], ids=["--spec not installed", "--flavor of the tiny model", "--flavor of a spec checked"])
def test_a_check_s_own_spec_or_flavor_that_does_not_exist_is_a_user_error(args: tuple[str, ...], said: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: every check ran and failed on it, a table of FAIL rows and exit 1, as if the plugin were at fault."""
    from titan_core.commands.titan_plugin import main as plugin_main

    result = harness.tool(capsys, plugin_main, "check", "--fast", *args)
    record(f"titan-plugin check {' '.join(args)} (FAIL rows, exit 1)", result)
    harness.assert_one_clean_error(result, f"titan-plugin: error: {said}")
    assert result.out == ""  # no table: nothing ran


def test_the_check_s_own_choices_that_exist_are_accepted() -> None:
    """The guard of the check: choices that exist raise nothing (a converter on the tiny model or llama3, a spec)."""
    from titan_core.commands.plugin_check import check_training_choices

    check_training_choices({"float8": "converter"}, spec="tiny", flavor=None)
    check_training_choices({"float8": "converter"}, spec="llama3", flavor="debugmodel_gqa")
    check_training_choices({"llama3": "spec", "mx": "converter"}, spec="tiny", flavor="debugmodel")
