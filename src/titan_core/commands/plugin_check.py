"""``titan-plugin check NAME...``: the conformance checks for installed converters and specs, as a table."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..config.overrides import parse_override_args
from ..errors import ConfigError, PluginError, TitanError, did_you_mean
from ..plan.resolve import resolve_config
from ..plugin.discovery import CONVERTERS, SPECS, discover, load_train_spec
from ..testing import CheckResult, Target
from ..testing.checks import Check, register_if_tiny, run_all
from .titan_train import build_parser as train_parser


def kind_of(name: str) -> str:
    """``spec`` or ``converter``: which entry-point group (or in-process registry) has ``name``."""

    specs, converters = discover(SPECS), discover(CONVERTERS)
    if name in specs and name in converters:
        raise ConfigError(f'"{name}" is both a spec and a converter; check it with --kind spec or --kind converter.')
    if name in specs:
        return "spec"
    if name in converters:
        return "converter"
    raise ConfigError(
        f'no installed spec or converter is named "{name}"{did_you_mean(name, [*specs, *converters])}. '
        f"`titan-train --list` shows what is installed; install the plugin (pip install ...) first."
    )


def checked_kind(name: str, kind: str) -> str:
    """``kind`` (from --kind) when ``name`` is installed as one; a ConfigError before any check runs when it is
    installed as the other kind only (its import failed as a check, a table and exit 1, which reads as the
    plugin's fault) or not installed at all (``kind_of``'s message)."""
    if kind == "spec":
        register_if_tiny(name)  # the core's tiny model is a spec only once asked for
    specs, converters = discover(SPECS), discover(CONVERTERS)
    if name in (specs if kind == "spec" else converters):
        return kind
    if name not in specs and name not in converters:
        return kind_of(name)  # raises: not installed, with a did-you-mean
    other = "converter" if kind == "spec" else "spec"
    raise ConfigError(f'--kind {kind}: "{name}" is an installed {other}, not a {kind}; check it with --kind {other}, '
                      f"or leave --kind out (it is needed only for a name that is both).")


def check_flag_values(kinds: Mapping[str, str], *, spec: str, flavor: str | None, flags: Sequence[str],
                      run_flags: Sequence[str] = ()) -> None:
    """The --flag values, validated against the config each training run resolves (the core's sections and the
    plugin's), before any check runs: a value the config refuses made every training check fail with the config
    error in its detail, and exit 1, as if the plugin were at fault. ``run_flags``: the check's own additions
    (--import, --model.plugin_timeout_s). Only the user's values are judged: where the config without them fails (a plugin
    that does not load or validate), nothing is said here and the checks report it."""
    if not flags:
        return
    def pairs_of(argv: Sequence[str]) -> list[tuple[str, str]]:
        parsed, rest = train_parser().parse_known_args(list(argv))
        named = [(key, getattr(parsed, flag)) for flag, key in
                 (("spec", "model.spec"), ("flavor", "model.flavor"), ("converters", "model.converters"))
                 if getattr(parsed, flag) is not None]
        return named + parse_override_args(rest)

    for name, kind in kinds.items():
        try:
            target = Target(kind, name, spec=spec, flavor=flavor, workdir=Path("."))
            base = [("model.spec", target.spec_name), ("model.flavor", target.flavor_name),
                    ("training.seq_len", str(target.seq_len)), ("training.steps", "5"),
                    *((("model.converters", name),) if kind == "converter" else ()), *pairs_of(run_flags)]
            resolve_config(config_source=None, override_pairs=base, world_size=1)
        except TitanError:
            continue  # not the user's flags: the checks say what is wrong with the plugin
        try:
            resolve_config(config_source=None, override_pairs=[*base, *pairs_of(flags)], world_size=1)
        except ConfigError as exc:
            raise ConfigError(f"--flag {' '.join(flags)}: every training run of the checks would refuse it: {exc}"
                              ) from None


def check_training_choices(kinds: Mapping[str, str], *, spec: str, flavor: str | None) -> None:
    """--spec and --flavor are the user's choices: a spec that is not installed, or a flavor the spec lacks, is
    one error before any check runs. It was a table of failed checks and exit 1, which reads as the plugin's
    fault."""
    specs = discover(SPECS)
    if "converter" in kinds.values() and spec != "tiny" and spec not in specs:
        raise ConfigError(f'--spec {spec}: no installed spec is named "{spec}".{did_you_mean(spec, list(specs))} '
                          f"Converters are trained on the core's tiny model (the default, --spec tiny) or on an "
                          f"installed spec; `titan-train --list` shows them.")
    if flavor is None:
        return
    for name, kind in kinds.items():
        spec_name = name if kind == "spec" else spec
        register_if_tiny(spec_name)
        try:
            flavors = list(load_train_spec(spec_name).flavors)
        except PluginError:
            continue  # a broken spec: the checks' import row says why
        if flavor not in flavors:
            raise ConfigError(f'--flavor {flavor}: spec "{spec_name}" has no flavor "{flavor}".'
                              f"{did_you_mean(flavor, flavors)} Its flavors: {', '.join(flavors)}.")


def format_table(name: str, kind: str, results: Sequence[CheckResult]) -> str:
    rows = [("check", "result", "figure", "time")] + [
        (r.name, r.status.upper() if r.status == "fail" else r.status, r.figure, f"{r.seconds:.1f} s") for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"{kind} {name}"]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    for r in results:
        if r.status == "fail":
            lines.append(f"\n{r.name} failed:\n  " + r.detail.replace("\n", "\n  "))
    return "\n".join(lines)


def check(names: Sequence[str], *, fast: bool, spec: str, compile: bool, kind: str | None,
          extra_flags: Sequence[str], flavor: str | None = None, user_flags: Sequence[str] = ()) -> int:
    """Check every name; print one table each; 1 if any check failed, else 0. ``user_flags``: the --flag values
    (the tail of ``extra_flags``), validated before any check runs."""

    kinds = {name: checked_kind(name, kind) if kind else kind_of(name) for name in names}  # known before any runs
    check_training_choices(kinds, spec=spec, flavor=flavor)
    check_flag_values(kinds, spec=spec, flavor=flavor, flags=user_flags,
                      run_flags=extra_flags[:len(extra_flags) - len(user_flags)])
    failed = False
    for name in names:
        k = kinds[name]
        target = Target(k, name, spec=spec, compile=compile, extra_flags=tuple(extra_flags), flavor=flavor)

        def announce(one: Check, name: str = name) -> None:  # this plugin's name, bound now
            print(f"[titan-plugin] {name}: {one.name} ...", file=sys.stderr, flush=True)

        results = run_all(target, fast=fast, announce=announce)
        print(format_table(name, k, results) + "\n", flush=True)
        if all(r.ok for r in results):
            shutil.rmtree(target.workdir, ignore_errors=True)  # checkpoints and logs of runs that all passed
        else:
            failed = True
            if any(target.workdir.iterdir()):
                print(f"the runs of {name} are kept in {target.workdir}\n", flush=True)
            else:
                shutil.rmtree(target.workdir, ignore_errors=True)
    print("titan-plugin check: " + ("FAILED" if failed else "all checks passed"), file=sys.stderr)
    return 1 if failed else 0
