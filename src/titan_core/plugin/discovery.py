"""Find TrainSpecs and ModelConverters: entry points plus in-process registrations.

Listing reads package metadata only; a plugin's module is imported when it is
requested (or when ``--list`` checks its health). Every rank runs the same code
on the same installed packages, so every rank loads the same plugins, and
loading is cached, so loading twice is a no-op.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from .._version import PLUGIN_API_VERSION
from ..console import env_is_rank0, progress
from ..errors import DeadlinePassed, PluginError, PluginHang, did_you_mean
from ..runtime.deadlines import call_deadline
from ..runtime.library_noise import quiet_torchao_extension_loads
from .call_timeout import plugin_timeout
from .entry_points import entry_points_of
from .section_names import refuse_core_section_name

if TYPE_CHECKING:
    from .protocols import ModelConverter, TrainSpec

T = TypeVar("T")

Group = Literal["titan.train_specs", "titan.model_converters"]
SPECS: Group = "titan.train_specs"
CONVERTERS: Group = "titan.model_converters"
_KIND = {SPECS: "spec", CONVERTERS: "converter"}

# Comma-separated plugin or distribution names that discovery ignores entirely.
DISABLE_ENV = "TITAN_DISABLE_PLUGINS"


@dataclass(frozen=True)
class PluginInfo:
    """One discovered plugin, as package metadata (or an in-process registration) says."""

    name: str
    group: Group
    distribution: str
    version: str
    target: str  # "module:attr" of the entry point, or "<in-process>"


@dataclass(frozen=True)
class PluginHealth:
    """What loading a plugin showed: its plugin-API version, or why it is broken."""

    info: PluginInfo
    api_version: str | None
    error: str | None


_registered: dict[str, dict[str, tuple[Any, PluginInfo]]] = {SPECS: {}, CONVERTERS: {}}
_loaded: dict[tuple[str, str], object] = {}


def _disabled() -> set[str]:
    return {part.strip() for part in os.environ.get(DISABLE_ENV, "").split(",") if part.strip()}


def discover(group: Group) -> dict[str, list[PluginInfo]]:
    """Name -> every distribution that claims it (more than one is a clash). Imports nothing."""
    found: dict[str, list[PluginInfo]] = {}
    off = _disabled()
    for ep, dist_name, dist_version in entry_points_of(group):
        if ep.name in off or dist_name in off:
            continue
        info = PluginInfo(ep.name, group, dist_name, dist_version, ep.value)
        claims = found.setdefault(ep.name, [])
        # An editable install can list one distribution twice; that is not a clash.
        if all(c.distribution != info.distribution for c in claims):
            claims.append(info)
    for name, (_, info) in _registered[group].items():
        found.setdefault(name, [])
        if info not in found[name]:
            found[name].append(info)
    return found


def _register(group: Group, name: str, obj: object, module: str | None = None) -> None:
    current = _registered[group].get(name)
    if current is not None and current[0] is not obj:
        raise PluginError(
            f'{_KIND[group]} "{name}" is already registered in this process by {current[1].target}; '
            f"register each name once (or choose another name)."
        )
    module = module or getattr(obj, "__module__", "<in-process>")
    _registered[group][name] = (obj, PluginInfo(name, group, f"<registered in {module}>", "-", "<in-process>"))
    _loaded.pop((group, name), None)


def register_train_spec(spec: TrainSpec | Callable[[], TrainSpec], name: str | None = None) -> None:
    """Register a TrainSpec (or a zero-argument callable returning one) in this process."""
    if name is None:
        name = getattr(spec, "name", None)
        if not isinstance(name, str):
            raise PluginError(
                f"register_train_spec({spec!r}): a factory has no spec name to register under; "
                f"pass name= (the name the spec is requested by)."
            )
    # A TrainSpec instance's __module__ is its class's (titan_core.plugin.protocols): name the registering module.
    caller = None if callable(spec) else sys._getframe(1).f_globals.get("__name__")
    _register(SPECS, name, spec, caller)


def register_model_converter(name: str, converter_cls: type[ModelConverter[Any]]) -> None:
    """Register a ModelConverter class under ``name`` in this process."""
    _register(CONVERTERS, name, converter_cls)


def import_modules(names: list[str]) -> None:
    """``--import mod.name``: import modules that register plugins in-process."""
    for module in names:
        try:
            importlib.import_module(module)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit() there is an error, not a quiet exit 0
            raise PluginError(
                f'--import {module}: the module could not be imported ({type(exc).__name__}: {exc}). '
                f"Check the module name and that its package is on sys.path (--traceback shows where it failed)."
            ) from exc


def _resolve_one(group: Group, name: str) -> PluginInfo:
    found = discover(group)
    kind = _KIND[group]
    if name not in found:
        installed = sorted(found)
        listed = ", ".join(installed) if installed else "none"
        raise PluginError(
            f'unknown {kind} "{name}".{did_you_mean(name, installed)} Installed {kind}s: {listed}. '
            f"Run titan-train --list to see them with their distributions, or install the package that provides it."
        )
    claims = found[name]
    if len(claims) > 1:
        who = " and ".join(f"{c.distribution} {c.version} ({c.target})" for c in claims)
        raise PluginError(
            f'{kind} "{name}" is provided by more than one distribution: {who}. Uninstall one of them, '
            f"or disable one with {DISABLE_ENV}=<distribution>."
        )
    return claims[0]


def _api_parts(version: str) -> tuple[int, int] | None:
    """``"1.1"`` -> (1, 1); a bare ``"1"`` is 1.0 and a patch part is ignored (both were accepted before
    minors were checked); None for anything else."""
    parts = version.strip().split(".")
    # a part of at most 9 digits: int() refuses one of over 4,300 (a traceback in titan-train --list)
    if not all(p.isascii() and p.isdigit() and len(p) <= 9 for p in parts) or len(parts) > 3:
        return None
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def api_refusal(api_version: str) -> str | None:
    """Why this core cannot serve a plugin written for ``api_version``; None when it can.

    The core serves its own major at any minor up to its own (minor versions only add), and
    nothing else: another major, a newer minor (the plugin may use what this core lacks), a
    version that is not MAJOR.MINOR.
    """
    core = _api_parts(PLUGIN_API_VERSION)
    plugin = _api_parts(api_version)
    assert core is not None
    if plugin is None:
        return f'"{_shown(api_version)}" is not a plugin API version: write MAJOR.MINOR, e.g. "{PLUGIN_API_VERSION}"'
    if plugin[0] != core[0]:
        return f"titan-core {core[0]}.x and {plugin[0]}.x are different contracts"
    if plugin[1] > core[1]:
        return "the plugin may use what that newer API added"
    return None


def _shown(api_version: str) -> str:
    """A declared version as a message quotes it: the start of one that is longer than any version."""
    return api_version if len(api_version) <= 40 else f"{api_version[:40]}... ({len(api_version):,} characters)"


def _check_api(info: PluginInfo, declared: object) -> None:
    served = f"{PLUGIN_API_VERSION.split('.')[0]}.0 to {PLUGIN_API_VERSION}"
    if not isinstance(declared, str):
        # str() of it was compared before: a float 1.10 passed as "1.1", and an object whose __str__ raised ended
        # titan-train --list (and any run naming the plugin) with a traceback
        raise PluginError(
            f'{_KIND[info.group]} "{info.name}" from {info.distribution} {info.version} declares its '
            f"plugin_api_version as a {type(declared).__name__}, not a string. Its plugin_api_version must be the "
            f'API it was written for as text, e.g. "{PLUGIN_API_VERSION}": fix {info.distribution}, or install a '
            f"version of it built for plugin API {served}."
        )
    api_version = declared
    why = api_refusal(api_version)
    if why is None:
        return
    fix = (f"Install a version of {info.distribution} built for plugin API {served}, or a titan-core that serves "
           f"plugin API {api_version}." if _api_parts(api_version) else
           f"Its plugin_api_version must be the API it was written for, e.g. \"{PLUGIN_API_VERSION}\": fix "
           f"{info.distribution}, or install a version of it built for plugin API {served}.")
    raise PluginError(
        f'{_KIND[info.group]} "{info.name}" from {info.distribution} {info.version} was written for '
        f"titan-core plugin API {_shown(api_version)}, but this titan-core serves plugin API {PLUGIN_API_VERSION} "
        f"({why}). {fix}"
    )


def _refuse_core_section_name(info: PluginInfo) -> None:
    version = f" {info.version}" if info.version and info.version != "-" else ""
    refuse_core_section_name(
        info.name, who=f'{_KIND[info.group]} "{info.name}" of {info.distribution}{version} ({info.target})',
        fix=f"Rename its entry point in {info.distribution} (or disable it with {DISABLE_ENV}={info.distribution}).")


def _import_target(info: PluginInfo) -> Any:
    if info.target == "<in-process>":
        return _registered[info.group][info.name][0]
    module_name, _, attr = info.target.partition(":")
    quiet_torchao_extension_loads()  # a converter imports torchao, which warns of extensions this machine cannot load
    try:
        obj: Any = importlib.import_module(module_name.strip())
        for part in attr.strip().split(".") if attr else []:
            obj = getattr(obj, part)
        return obj
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit() there is an error, not a quiet exit 0
        raise _load_failure(info, "failed to import", exc) from exc


def _load_failure(info: PluginInfo, failed: str, exc: BaseException) -> PluginError:
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return PluginError(
        f'{_KIND[info.group]} "{info.name}" {failed}: entry point "{info.name} = {info.target}" '
        f"of {info.distribution} {info.version} raised {type(exc).__name__}: {first_line}. "
        f"Reinstall or fix {info.distribution} (--traceback shows the full traceback), or disable it with "
        f"{DISABLE_ENV}={info.distribution}."
    )


def _finished(info: PluginInfo, finish: Callable[[Any], T], obj: object) -> T:
    """``finish(obj)``, which calls a spec's factory: what the factory raises is the plugin's error, as what its
    import raises is. It was a traceback, and a factory's sys.exit(0) ended titan-train quietly with exit 0 (a
    run that did nothing, a --list cut short)."""
    try:
        return finish(obj)
    except PluginError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        raise _load_failure(info, "failed when its factory was called", exc) from exc


def _bounded(info: PluginInfo, load: Callable[[], T]) -> T:
    """``load()`` (the import, and a spec's factory) under model.plugin_timeout_s's default: a module that waits
    for a server that never answers held titan-train, --list included, for ever. The run's own
    model.plugin_timeout_s is not read yet (plugins are loaded to read the config), so the message names the
    way out that works: disabling the plugin."""
    seconds = plugin_timeout()

    def message() -> str:
        return (f'{_KIND[info.group]} "{info.name}" ({info.distribution} {info.version}) did not finish loading '
                f"within {seconds:g} s: entry point \"{info.name} = {info.target}\" hangs (waits for something "
                f"that never comes, or loops). Report it to the authors of {info.distribution}, or disable it with "
                f"{DISABLE_ENV}={info.distribution}.")

    try:
        with call_deadline(seconds, f"loading {info.name}", message=message):
            return load()
    except DeadlinePassed:
        raise PluginHang(message(), method="import", seconds=seconds) from None


def _load(group: Group, name: str, finish: Callable[[Any], T]) -> T:
    # ``finish`` checks the imported object's type, so the cache holds only what it returned.
    key = (group, name)
    if key not in _loaded:
        info = _resolve_one(group, name)
        _refuse_core_section_name(info)
        obj = _bounded(info, lambda: _finished(info, finish, _import_target(info)))
        _check_api(info, getattr(obj, "plugin_api_version", PLUGIN_API_VERSION))
        _loaded[key] = obj
    return cast(T, _loaded[key])


DEFAULT_SPEC_ENV = "TITAN_DEFAULT_SPEC"


def default_spec_name() -> str:
    """The spec of a run that names none (``model.spec`` unset): the only installed one.

    With several installed, the one the environment variable ``TITAN_DEFAULT_SPEC`` names
    (if it is one of them), else an error asking for ``--spec``.

    Installed means found through an entry point; specs registered in-process (tests,
    notebooks, ``--import``) are chosen by name.
    """
    found = discover(SPECS)
    installed = sorted(n for n, claims in found.items() if any(c.target != "<in-process>" for c in claims))
    how = "--model.spec=NAME (or --spec NAME, or model.spec in --config)"
    if len(installed) == 1:
        return installed[0]
    # A machine (or CI) with several specs installed may name the one its bare commands mean.
    preferred = os.environ.get(DEFAULT_SPEC_ENV)
    if preferred in installed:
        return str(preferred)
    if not installed:
        registered = sorted(set(found) - set(installed))
        also = f" Registered in this process: {', '.join(registered)}." if registered else ""
        raise PluginError(
            f"model.spec is not set and no TrainSpec is installed.{also} Install a model plugin (a package with "
            f"a titan.train_specs entry point) or register one with --import MODULE, and choose it with {how}."
        )
    raise PluginError(
        f"model.spec is not set and {len(installed)} specs are installed: {', '.join(installed)}. "
        f"Choose one with {how}."
    )


def load_train_spec(name: str) -> TrainSpec:
    """The TrainSpec called ``name``; a zero-argument factory is called once."""
    from .protocols import TrainSpec  # start-up: --list reads entry points without torch (protocols imports it)

    def finish(obj: object) -> TrainSpec:
        spec = obj if isinstance(obj, TrainSpec) else obj() if callable(obj) else obj
        if not isinstance(spec, TrainSpec):
            raise PluginError(f'spec "{name}" resolved to {type(spec).__name__}, not a titan_core.TrainSpec.')
        _require_dataclass_flavors(name, spec)
        _check_spec_name(name, spec)
        return spec

    return _load(SPECS, name, finish)


def _check_spec_name(name: str, spec: TrainSpec) -> None:
    """The spec's config section is ``[TrainSpec.name]``, which may differ from the name it is requested by:
    refused where that section would shadow a core one (a spec calling itself "training" replaced the core's
    [training]), and said once where it differs at all (``--NAME.KEY`` is then an unknown section)."""
    own = spec.name
    if not isinstance(own, str) or not own:
        raise PluginError(f'spec "{name}": TrainSpec.name is {own!r:.60}; it must be a non-empty string (it names '
                          f'the spec\'s config section), e.g. name="{name}".')
    if own == name:
        return
    refuse_core_section_name(own, who=f'spec "{name}" (its TrainSpec.name)',
                             fix=f'Set TrainSpec.name to "{name}", the name it is registered under.')
    progress(f'warning: spec "{name}" calls itself "{own}" (TrainSpec.name), so its config section is [{own}] '
             f'(--{own}.KEY=VALUE), not [{name}]; set TrainSpec.name = "{name}" so the two agree.',
             is_rank0=env_is_rank0())


def _require_dataclass_flavors(name: str, spec: TrainSpec) -> None:
    """Flavors are dataclass instances: the core copies them with section overrides and the tokenizer's
    vocabulary (dataclasses.replace) and records their fields in checkpoints; anything else failed later
    with a TypeError deep in that code."""
    import dataclasses
    from collections.abc import Mapping

    flavors = spec.flavors
    if not isinstance(flavors, Mapping) or not flavors:
        raise PluginError(f'spec "{name}": flavors is {type(flavors).__name__} {flavors!r:.60}; it must map flavor '
                          f'names to the model\'s args, e.g. flavors={{"debugmodel": MyArgs(dim=64)}}.')
    bad = {f: args for f, args in flavors.items() if not dataclasses.is_dataclass(args) or isinstance(args, type)}
    if bad:
        listed = ", ".join(f'"{f}" ({"the class " if isinstance(a, type) else ""}{getattr(a, "__name__", type(a).__name__)})'
                           for f, a in bad.items())
        raise PluginError(f'spec "{name}": flavor {listed} is not a dataclass instance. A flavor is the model\'s '
                          f"args as an instance of a @dataclass (e.g. MyArgs(dim=64)), which the core copies with "
                          f"the config's overrides; see docs/writing-a-train-spec.md, section 5.")


def load_converter(name: str) -> type[ModelConverter[Any]]:
    """The ModelConverter class called ``name``."""
    from .protocols import ModelConverter  # start-up: as in load_train_spec

    def finish(obj: object) -> type[ModelConverter[Any]]:
        if not (isinstance(obj, type) and issubclass(obj, ModelConverter)):
            # named by its type, not its repr(): a repr that raised was a traceback, and a long one a page
            what = f"the class {getattr(obj, '__qualname__', '?')}" if isinstance(obj, type) else type(obj).__name__
            raise PluginError(f'converter "{name}" resolved to {what}, not a titan_core.ModelConverter subclass.')
        return obj

    return _load(CONVERTERS, name, finish)


def health(info: PluginInfo, *, with_traceback: bool = False) -> PluginHealth:
    """Load one plugin to report its API version or why it is broken (for ``--list``)."""
    try:
        obj: object = load_train_spec(info.name) if info.group == SPECS else load_converter(info.name)
    except PluginError as exc:
        detail = "".join(traceback.format_exception(exc.__cause__ or exc)) if with_traceback else str(exc)
        return PluginHealth(info, None, detail)
    return PluginHealth(info, str(getattr(obj, "plugin_api_version", PLUGIN_API_VERSION)), None)
