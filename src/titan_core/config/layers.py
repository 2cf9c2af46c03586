"""Where config values come from, and how they merge (later wins).

field defaults < the spec's defaults < ``--config`` (TOML file or ``pkg.mod:fn``)
< ``--section.key=value`` flags.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from ..errors import ConfigError, DeadlinePassed, did_you_mean
from ..runtime.deadlines import call_deadline
from ..runtime.os_errors import file_kind
from .finite import parse_toml_float

T = TypeVar("T")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Layer = dict[str, dict[str, Any]]


def merge(*layers: Layer) -> Layer:
    """Section-wise merge; a later layer's key replaces an earlier one's (nested dicts merge)."""
    out: Layer = {}
    for layer in layers:
        for section, values in layer.items():
            if not isinstance(values, dict):
                raise ConfigError(f'config section "{section}" must be a table of keys, got {values!r}.')
            out[section] = _merge_dict(out.get(section, {}), values)
    return out


def _merge_dict(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge_dict(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config_source(source: str) -> Layer:
    """``--config``: a TOML file path, or ``pkg.module:function`` returning a JobConfig or a dict."""
    if source.endswith(".toml") or "/" in source or Path(source).exists():
        return _load_toml(Path(source))
    if ":" in source:
        return _call_config_function(source)
    raise ConfigError(
        f'--config {source}: not a .toml file and not a "pkg.module:function" reference. '
        f"Pass a path to a TOML file or a config function such as mypkg.configs:debug_run."
    )


MAX_CONFIG_BYTES = 16 * 2**20  # a config is a few KB; more is a wrong file (a dataset, a checkpoint, /dev/zero)


def _load_toml(path: Path) -> Layer:
    if not path.is_file():
        if path.exists():  # a FIFO would block the read forever, a device never end: say what it is
            kind = "a folder" if path.is_dir() else file_kind(path)
            raise ConfigError(f"--config {path} is {kind}, not a regular file. Pass a TOML config file.")
        raise ConfigError(f"--config {path}: no such file. Check the path (relative paths start at {Path.cwd()}).")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"--config {path}: {size:,} bytes, more than a config file can be (at most "
                          f"{MAX_CONFIG_BYTES // 2**20} MiB); pass the run's TOML config file.")
    try:
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = _with_non_utf8_names(raw)
        # A BOM some editors write is not TOML.
        return tomllib.loads(text.removeprefix("\ufeff"), parse_float=parse_toml_float)
    except RecursionError:
        raise ConfigError(f"--config {path}: the TOML nests arrays or tables too deeply to be a config file. "
                          f"Pass a TOML config file.") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not a text file (it is not UTF-8). Pass a TOML config file.") from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message already says "(at line N, column M)".
        raise ConfigError(f"--config {path}: TOML syntax error: {exc}. Fix the file at that line.") from None


def _with_non_utf8_names(raw: bytes) -> str:
    """A config.toml that titan wrote for a run folder whose name is not UTF-8 holds the name's bytes
    (config/toml_out.py); read them back as Python holds such names. Anything else that is not UTF-8
    (a binary file) stays refused."""
    text = raw.decode("utf-8", "surrogateescape")
    try:
        parsed = tomllib.loads(text, parse_float=parse_toml_float)
    except tomllib.TOMLDecodeError:
        raise UnicodeDecodeError("utf-8", raw, 0, len(raw), "not UTF-8") from None
    # Only a path may hold such bytes (a file system name); text elsewhere (a description in
    # Latin-1) is a file in the wrong encoding, refused as before.
    if any(not key.endswith(_PATH_KEYS) for key in _keys_with_undecodable_bytes(parsed)):
        raise UnicodeDecodeError("utf-8", raw, 0, len(raw), "not UTF-8")
    return text


# Settings whose value is a file system path (job.run_dir, checkpoint.folder, data.source, ...).
_PATH_KEYS = ("run_dir", "folder", "source", "tokenizer", "initial_load")


def _keys_with_undecodable_bytes(value: object, key: str = "") -> list[str]:
    """The dotted keys whose strings hold bytes that were not UTF-8 (decoded as lone surrogates)."""
    if isinstance(value, dict):
        return [k for name, v in value.items() for k in _keys_with_undecodable_bytes(v, f"{key}.{name}".lstrip("."))]
    if isinstance(value, list):
        return [k for v in value for k in _keys_with_undecodable_bytes(v, key)]
    if isinstance(value, str) and any("\udc80" <= ch <= "\udcff" for ch in value):
        return [key]
    return []


# How long a --config module's import or its function may take: as long as a plugin's import may (the
# config comes before any setting could change it). Longer is a hang: waiting on input, a lock, a network.
USER_CODE_TIMEOUT_S = 1800.0


def _run_user_code(call: Callable[[], T], message: Callable[[BaseException], str], *, what: str) -> T:
    """``call()`` (a --config module's import or its function) with what it prints sent to stderr (stdout may be
    --print-config's TOML); anything it raises, sys.exit() and Ctrl+C included, is a ConfigError from ``message``,
    and a call that does not return within USER_CODE_TIMEOUT_S one naming ``what`` as hung."""
    seconds = USER_CODE_TIMEOUT_S

    def hung() -> str:
        return (f"{what} did not return within {seconds:g} s: it hangs (waiting on input, a lock or the network?). "
                f"Fix it so that it returns; --traceback shows where it was.")

    try:
        with contextlib.redirect_stdout(sys.stderr), call_deadline(seconds, what, message=hung):
            return call()
    except DeadlinePassed as exc:
        raise ConfigError(hung()) from exc
    except BaseException as exc:  # sys.exit() there is an error, not a quiet exit 0; so is any BaseException
        if isinstance(exc, GeneratorExit):
            raise
        raise ConfigError(message(exc)) from exc


def _call_config_function(ref: str) -> Layer:
    module_name, _, fn_name = ref.partition(":")
    module = _run_user_code(lambda: importlib.import_module(module_name), lambda exc: (
        f"--config {ref}: module {module_name!r} could not be imported ({type(exc).__name__}: {exc}). "
        f"Check the module path and that it is importable (installed, or on PYTHONPATH)."),
        what=f"--config {ref}: importing {module_name}")
    fn = getattr(module, fn_name, None)
    if fn is None or not callable(fn):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]

        raise ConfigError(
            f"--config {ref}: module {module_name} has no function {fn_name!r}.{did_you_mean(fn_name, names)} "
            f"Functions there: {', '.join(names) or 'none'}."
        )
    result = _run_user_code(fn, lambda exc: (
        f"--config {ref}: the config function raised {type(exc).__name__}: {exc}. Fix the function "
        f"(--traceback shows where)."), what=f"--config {ref}: the config function")
    if isinstance(result, BaseModel):
        # Only what the function set explicitly counts as a layer, so the spec's defaults
        # still apply to everything it left alone.
        return result.model_dump(exclude_unset=True)
    if isinstance(result, dict):
        _require_plain_tree(result, ref=ref)
        return result
    raise ConfigError(f"--config {ref}: the config function returned {type(result).__name__}; return a JobConfig or a dict.")


_MAX_DEPTH = 32


def _require_plain_tree(value: object, *, ref: str, depth: int = 0, seen: frozenset[int] = frozenset()) -> None:
    """A config dict is a finite tree: one that contains itself, or nests absurdly deep, is refused by name."""
    if not isinstance(value, (dict, list, tuple)):
        return
    if id(value) in seen or depth > _MAX_DEPTH:
        raise ConfigError(f"--config {ref}: the config function returned a dict that contains itself or nests "
                          f"more than {_MAX_DEPTH} levels deep; return plain sections of plain values.")
    inner = seen | {id(value)}
    for item in (value.values() if isinstance(value, dict) else value):
        _require_plain_tree(item, ref=ref, depth=depth + 1, seen=inner)
