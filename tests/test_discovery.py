"""Discovery logic against fake package metadata (fast), plus in-process registration."""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass

import pytest

from titan_core import PLUGIN_API_VERSION, ModelConverter, PluginError
from titan_core.plugin import discovery

from conftest import assert_user_error


@dataclass
class FakeEntryPoint:
    name: str
    value: str


@pytest.fixture
def fake_metadata(monkeypatch: pytest.MonkeyPatch):
    """Replace the entry-point listing; returns a dict group -> list of (name, value, dist, version)."""
    table: dict[str, list[tuple[str, str, str, str]]] = {discovery.SPECS: [], discovery.CONVERTERS: []}

    def entry_points_of(group: str):
        for name, value, dist, version in table[group]:
            yield FakeEntryPoint(name, value), dist, version

    monkeypatch.setattr(discovery, "entry_points_of", entry_points_of)
    monkeypatch.setattr(discovery, "_loaded", {})
    monkeypatch.setattr(discovery, "_registered", {discovery.SPECS: {}, discovery.CONVERTERS: {}})
    return table


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, mod)


class GoodConverter(ModelConverter):
    def select(self, model):
        return []

    def convert(self, model, fqns):
        return None


class OldConverter(GoodConverter):
    plugin_api_version = "0.3"


def test_listing_imports_nothing(fake_metadata) -> None:
    fake_metadata[discovery.CONVERTERS].append(("ghost", "never_imported_pkg.mod:Conv", "ghost-dist", "1.2"))
    found = discovery.discover(discovery.CONVERTERS)
    assert found["ghost"][0].distribution == "ghost-dist"
    assert found["ghost"][0].version == "1.2"
    assert "never_imported_pkg" not in sys.modules


def test_load_and_cache(fake_metadata, monkeypatch: pytest.MonkeyPatch) -> None:
    _module(monkeypatch, "good_pkg", GoodConverter=GoodConverter)
    fake_metadata[discovery.CONVERTERS].append(("good", "good_pkg:GoodConverter", "good-dist", "0.1"))
    assert discovery.load_converter("good") is GoodConverter
    assert discovery.load_converter("good") is GoodConverter  # idempotent


def test_clash_names_both_distributions(fake_metadata) -> None:
    fake_metadata[discovery.CONVERTERS] += [("int8", "a:X", "dist-a", "1.0"), ("int8", "b:X", "dist-b", "2.0")]
    with pytest.raises(PluginError, match="dist-a 1.0.*dist-b 2.0"):
        discovery.load_converter("int8")


def test_same_distribution_twice_is_not_a_clash(fake_metadata, monkeypatch: pytest.MonkeyPatch) -> None:
    _module(monkeypatch, "good_pkg", GoodConverter=GoodConverter)
    fake_metadata[discovery.CONVERTERS] += [("good", "good_pkg:GoodConverter", "d", "1")] * 2
    assert discovery.load_converter("good") is GoodConverter


def test_import_failure_names_entry_point_distribution_and_cause(fake_metadata) -> None:
    fake_metadata[discovery.CONVERTERS].append(("bad", "no_such_pkg_123.mod:Conv", "bad-dist", "0.9"))
    with pytest.raises(PluginError) as info:
        discovery.load_converter("bad")
    msg = str(info.value)
    for part in ('"bad = no_such_pkg_123.mod:Conv"', "bad-dist 0.9", "ModuleNotFoundError", "no_such_pkg_123"):
        assert part in msg


def test_incompatible_api_major(fake_metadata, monkeypatch: pytest.MonkeyPatch) -> None:
    _module(monkeypatch, "old_pkg", OldConverter=OldConverter)
    fake_metadata[discovery.CONVERTERS].append(("old", "old_pkg:OldConverter", "old-dist", "0.3.0"))
    with pytest.raises(PluginError, match=rf"plugin API 0\.3, but this titan-core serves plugin API {re.escape(PLUGIN_API_VERSION)}"):
        discovery.load_converter("old")


def test_unknown_name_lists_installed_with_did_you_mean(fake_metadata) -> None:
    fake_metadata[discovery.CONVERTERS] += [("float8", "x:y", "titan-float8", "0.1"), ("mx", "x:z", "titan-mx", "0.1")]
    with pytest.raises(PluginError, match=r'unknown converter "flot8". Did you mean "float8"\? Installed converters: float8, mx'):
        discovery.load_converter("flot8")


def test_broken_unrequested_plugin_does_not_matter(fake_metadata, monkeypatch: pytest.MonkeyPatch) -> None:
    _module(monkeypatch, "good_pkg", GoodConverter=GoodConverter)
    fake_metadata[discovery.CONVERTERS] += [("good", "good_pkg:GoodConverter", "g", "1"), ("bad", "nope_mod:X", "b", "1")]
    assert discovery.load_converter("good") is GoodConverter
    health = {i.name: discovery.health(claims[0]) for i, claims in
              ((c[0], c) for c in discovery.discover(discovery.CONVERTERS).values())}
    assert health["good"].error is None and health["good"].api_version == PLUGIN_API_VERSION
    assert health["bad"].error is not None and "nope_mod" in health["bad"].error


def test_disable_env(fake_metadata, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_metadata[discovery.CONVERTERS] += [("a", "x:y", "dist-a", "1"), ("b", "x:y", "dist-b", "1")]
    monkeypatch.setenv(discovery.DISABLE_ENV, "dist-a")
    assert set(discovery.discover(discovery.CONVERTERS)) == {"b"}


def test_in_process_registration(fake_metadata) -> None:
    discovery.register_model_converter("local", GoodConverter)
    discovery.register_model_converter("local", GoodConverter)  # same object again: a no-op
    assert discovery.load_converter("local") is GoodConverter
    with pytest.raises(PluginError, match="already registered"):
        discovery.register_model_converter("local", OldConverter)


def test_import_flag_registers(cli, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_local_plugin.py").write_text(
        "from titan_core import ModelConverter, register_model_converter\n"
        "class Noop(ModelConverter):\n"
        "    def select(self, model):\n        return [n for n, m in model.named_modules() if n == 'output']\n"
        "    def convert(self, model, fqns):\n        pass\n"
        "register_model_converter('noop_local', Noop)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = cli("--import", "my_local_plugin", "--list")
    assert result.code == 0, result.text
    assert "noop_local" in result.out and "registered in my_local_plugin" in result.out
    assert_user_error(cli("--import", "not_a_module_zz", "--list"), "--import not_a_module_zz", "could not be imported")


# ---- the spec of a run that names none -----------------------------------------------------------

def test_the_only_installed_spec_is_the_default(fake_metadata, monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_llama.spec import llama3_spec

    _module(monkeypatch, "solo_pkg", SPEC=llama3_spec)
    fake_metadata[discovery.SPECS].append(("solo", "solo_pkg:SPEC", "solo-dist", "1.0"))
    # An in-process registration is chosen by name only: it does not make the default ambiguous.
    discovery.register_train_spec(llama3_spec, "registered_here")
    assert discovery.default_spec_name() == "solo"


def test_no_default_spec_among_several_or_none(fake_metadata, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_llama.spec import llama3_spec

    discovery.register_train_spec(llama3_spec, "registered_here")
    assert_user_error(cli("--dry-run"), "model.spec is not set and no TrainSpec is installed",
                      "Registered in this process: registered_here", "--model.spec=NAME")
    fake_metadata[discovery.SPECS] += [("beta", "b:S", "beta-dist", "1.0"), ("alpha", "a:S", "alpha-dist", "1.0")]
    result = cli("--print-config")
    assert_user_error(result, "model.spec is not set and 2 specs are installed: alpha, beta.",
                      "Choose one with --model.spec=NAME (or --spec NAME, or model.spec in --config).")
    # Named, the spec is found as before (and the others are never imported).
    _module(monkeypatch, "a", S=llama3_spec)
    ok = cli("--spec", "alpha", "--print-config")
    assert ok.code == 0, ok.text
    assert 'spec = "alpha"' in ok.out
