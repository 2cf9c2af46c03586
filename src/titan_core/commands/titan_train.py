"""``titan-train``: a few run-level flags; every config value is ``--section.key=value``.

Kept light: ``--help`` and ``--list`` import neither torchao nor the data stack.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from ..config.environment import check_environment
from ..config.overrides import parse_override_args
from ..config.toml_out import dumps
from ..config.unused_settings import idle_settings
from ..console import env_is_rank0, progress, rank_prefix, say
from ..errors import ConfigError, StopRequested, Terminated, TitanError
from ..plugin import discovery
from ..runtime.launch_env import world_size_from_env
from ..runtime.launch_environment import check_launch_environment
from ..runtime.os_errors import describe_os_error
from ..runtime.path_settings import remember_paths
from ..runtime.worker_errors import INTERRUPTED, hand_to_launcher, under_launcher
from ..train.target_devices import parse_target_device  # a leaf: no torch at start-up
from .launch import relaunch
from .list_plugins import print_plugin_list

if TYPE_CHECKING:
    from ..train.trainer import Trainer

EPILOG = """\
config values:
  Every field of every section is set as --section.key=value (lists as a,b), e.g.
  --training.steps=50 --optimizer.lr=1e-3 --parallelism.tp=2; a requested plugin's
  section works the same way (--CONVERTER.KEY=VALUE).
  Sources, later wins: defaults < the spec's defaults < --config < --section.key flags.
  titan-train --schema lists every section and key; docs/configuration.md explains them.
  Without --spec the run uses the only installed spec; with several installed, name one
  (titan-train --list shows them).

examples:
  titan-train --spec llama3 --flavor debugmodel --training.steps=200
  titan-train --spec llama3 --converters float8,mx --dry-run
  titan-train --spec llama3 --nproc-per-node 2 --parallelism.dp_shard=2 --training.steps=20
  torchrun --nproc-per-node 2 -m titan_core --spec llama3 --parallelism.tp=2
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="titan-train", description="Pre-train an LLM with titan-core; models and converters are plugins.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--list", action="store_true", help="list installed specs and converters, and exit")
    p.add_argument("--spec", help="TrainSpec name (same as --model.spec)")
    p.add_argument("--flavor", help="model flavor of the spec (same as --model.flavor)")
    p.add_argument("--converters", help="comma-separated converters, applied in order; later wins (same as --model.converters)")
    p.add_argument("--config", help="a TOML file, or pkg.module:function returning a config (config as code)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (it may register specs/converters in-process); repeatable")
    p.add_argument("--trainer", metavar="MODULE:CLASS",
                   help="run this Trainer subclass (e.g. my_pkg.trainers:MyTrainer) instead of the Trainer")
    p.add_argument("--print-config", action="store_true", help="print the merged config as TOML and exit")
    p.add_argument("--schema", action="store_true", help="print the JSON schema of the config and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, build the model on the meta device, apply converters, print the table, exit")
    p.add_argument("--compare-baseline", action="store_true",
                   help="train with and without the converters (same seed) and report the loss gap")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="re-launch through torch.distributed.run with N processes on this node")
    p.add_argument("--nnodes", type=int, default=None, metavar="N",
                   help="with --dry-run: plan for N machines of --nproc-per-node ranks each (world size N x M)")
    p.add_argument("--target-device", default=None, metavar="NAME|SIZE",
                   help="with --dry-run: the accelerator the plan is for (H100, H200, A100-40GB, ... or 80GiB; "
                        "cpu: this machine's memory, float32)")
    p.add_argument("--rehearse-rank", type=int, default=None, metavar="R",
                   help="train here as rank R of the --nnodes x --nproc-per-node layout, under torch's fake process "
                        "group (memory and step time of one real rank; losses are not the real run's)")
    p.add_argument("--traceback", action="store_true", help="show Python tracebacks for errors")
    return p


def _override_pairs(args: argparse.Namespace, rest: list[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for flag, key in (("spec", "model.spec"), ("flavor", "model.flavor"), ("converters", "model.converters")):
        value = getattr(args, flag)
        if value is not None:
            pairs.append((key, value))
    return pairs + parse_override_args(rest)


#: the flags that each choose what the command does instead of training (at most one is given)
MODE_FLAGS: tuple[tuple[str, str], ...] = (
    ("list", "--list"), ("print_config", "--print-config"), ("schema", "--schema"), ("dry_run", "--dry-run"),
    ("compare_baseline", "--compare-baseline"), ("rehearse_rank", "--rehearse-rank"),
)


def check_one_mode(args: argparse.Namespace) -> None:
    """ConfigError for two flags that each choose what the command does: one of them used to be dropped without a
    word (``--compare-baseline --dry-run`` only planned, ``--print-config --dry-run`` only printed)."""
    given = [flag for attr, flag in MODE_FLAGS if getattr(args, attr) not in (None, False)]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} each choose what titan-train does, and only one can run: give one "
                          f"of them per command.")


def run(args: argparse.Namespace, rest: list[str], argv: list[str], trainer_class: type[Trainer] | None = None) -> int:
    check_one_mode(args)
    discovery.import_modules(args.imports)
    if args.list:
        return print_plugin_list(with_traceback=args.traceback)
    if args.trainer is not None or trainer_class is not None:
        from .trainer_class import chosen_trainer  # start-up: imports torch

        trainer_class = chosen_trainer(args.trainer, trainer_class)
    check_launch_environment(args.nproc_per_node)
    check_plan_flags(args.nnodes, args.nproc_per_node, args.target_device,
                     dry_run=args.dry_run or args.rehearse_rank is not None, rehearsal=args.rehearse_rank is not None)
    world_size = (args.nnodes or 1) * args.nproc_per_node if args.nproc_per_node else world_size_from_env()
    if args.rehearse_rank is not None:
        rehearsal_environment(args.rehearse_rank, world_size, dry_run=args.dry_run)
    from ..plan.resolve import installed_job_model, resolve_config  # start-up: --help and --list stay without torch

    if args.schema and not _names_a_spec(args, rest):
        import json

        print(json.dumps(installed_job_model().model_json_schema(), indent=2))
        return 0

    resolved = resolve_config(config_source=args.config, override_pairs=_override_pairs(args, rest), world_size=world_size)
    from ..train.run_limits import apply_run_limits  # start-up: imports torch

    apply_run_limits(resolved.config)

    remember_paths(resolved.config)  # an error about a file then names the setting it came from
    if args.print_config:
        text = dumps(resolved.config.model_dump(mode="json"))
        out = getattr(sys.stdout, "buffer", None)
        if out is None:  # a text-only stream (in-process capture)
            print(text, end="")
            return 0
        sys.stdout.flush()  # as bytes: a run folder whose name is not UTF-8 is printed as its own bytes
        out.write(text.encode("utf-8", "surrogateescape"))
        out.flush()
        return 0
    if args.schema:
        import json

        print(json.dumps(resolved.job_model.model_json_schema(), indent=2))
        return 0
    check_environment(resolved.config)
    # The workers of a --nproc-per-node launch say it (their rank 0), not the launcher.
    relaunching = bool(args.nproc_per_node) and world_size_from_env() == 1 and not (
        args.rehearse_rank is not None or args.dry_run or args.compare_baseline)
    for line in idle_settings(resolved.config):  # the launcher's rank 0 worker says it, once
        progress(line, is_rank0=env_is_rank0() and not relaunching)
    if args.rehearse_rank is not None:
        from .rehearse import rehearse  # start-up: as below

        return rehearse(resolved, rank=args.rehearse_rank)
    if args.dry_run:
        from .dry_run import dry_run  # start-up: each command imports only what it runs

        return dry_run(resolved, target_device=args.target_device,
                       ranks_per_node=args.nproc_per_node or world_size, nnodes=args.nnodes or 1)
    if args.compare_baseline:
        from .compare import compare_baseline  # start-up: as above

        return compare_baseline(resolved, **({"trainer_class": trainer_class} if trainer_class else {}))
    if resolved.config.fault_tolerance.local_replicas:
        from ..fault_tolerance.supervisor import supervise  # start-up: imports torch

        return supervise(resolved.config, _worker_argv(args, argv, trainer_class))
    if args.nproc_per_node and world_size_from_env() == 1:
        from ..train.preflight import preflight  # start-up: as above

        preflight(resolved)  # one message here rather than one per worker, after each built the model
        return relaunch(args.nproc_per_node, _worker_argv(args, argv, trainer_class), config=resolved.config)
    from .train import train  # start-up: as above

    return train(resolved, trainer_class=trainer_class)


#: torch.distributed numbers ranks with C ints
MAX_RANKS = 2**31 - 1


def check_plan_flags(nnodes: int | None, nproc_per_node: int | None, target_device: str | None, *,
                     dry_run: bool, rehearsal: bool = False) -> None:
    """--nnodes and --target-device describe a cluster for the dry run's plan; a real run gets its machines
    from its launcher (torchrun --nnodes)."""
    for flag, value, modes in (("--nnodes", nnodes, "--dry-run or --rehearse-rank"),
                               ("--target-device", target_device, "--dry-run")):
        if value is not None and not dry_run:
            raise ConfigError(f"{flag} plans a cluster run and works with {modes} only; a run on "
                              f"several machines starts one torchrun per machine (docs/distributed.md, \"Several "
                              f"machines\").")
    # A rehearsal trains on this machine's device and measures it: a --target-device there was ignored without a
    # word, and its figures read as the named device's.
    if target_device is not None and rehearsal:
        raise ConfigError(f"--target-device {target_device} is for --dry-run's plan; --rehearse-rank trains on this "
                          f"machine's device and measures its memory. Leave --target-device out (run the rehearsal "
                          f"on a machine with that device), or plan with --dry-run --target-device {target_device}.")
    if nnodes is not None and (nnodes < 1 or nproc_per_node is None):
        raise ConfigError(f"--nnodes {nnodes}: give a number of machines >= 1 together with --nproc-per-node "
                          f"(ranks per machine), e.g. --nnodes 64 --nproc-per-node 8.")
    world_size = (nnodes or 1) * (nproc_per_node or 1)
    if world_size > MAX_RANKS:
        layout = f"--nnodes {nnodes} x --nproc-per-node {nproc_per_node}" if nnodes else f"--nproc-per-node {nproc_per_node}"
        raise ConfigError(f"{layout} = {world_size:,} ranks: torch numbers ranks with 32-bit integers, so a "
                          f"layout has at most {MAX_RANKS:,}. Give the number of machines and the ranks per machine, "
                          f"e.g. --nnodes 64 --nproc-per-node 8.")
    if target_device is not None and target_device.strip().lower() != "cpu":
        parse_target_device(target_device)  # a misspelt device is refused before anything is loaded


def rehearsal_environment(rank: int, world_size: int, *, dry_run: bool) -> None:
    """What a launcher would tell rank ``rank``, for this one process: it is the only rank on this machine."""
    if dry_run:
        raise ConfigError("--rehearse-rank trains one rank; --dry-run plans every rank: use one or the other.")
    if world_size < 2:
        given = f"the layout given has {world_size} rank" if world_size == 1 else "no layout was given"
        raise ConfigError(f"--rehearse-rank {rank} rehearses one rank of a layout of several ({given}): give its "
                          f"size with --nproc-per-node M (and --nnodes N for several machines), e.g. --nnodes 8 "
                          f"--nproc-per-node 8 --rehearse-rank 0. A one-rank job is a plain run: drop --rehearse-rank.")
    if not 0 <= rank < world_size:
        raise ConfigError(f"--rehearse-rank {rank}: the layout has ranks 0 to {world_size - 1}.")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")


@contextlib.contextmanager
def launcher_environment_kept() -> Iterator[None]:
    """Put back what ``rehearsal_environment`` sets when the command ends, however it ends: ``main`` called twice
    in one process (a notebook, a test) must not find the last rehearsal's rank in the environment."""
    saved = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _worker_argv(args: argparse.Namespace, argv: list[str], trainer_class: type[Trainer] | None) -> list[str]:
    """The command line of the worker processes: a class given to ``main`` travels as ``--trainer``,
    so every worker imports the same one."""
    if trainer_class is None or args.trainer is not None:
        return argv
    from .trainer_class import trainer_ref  # start-up: imports torch

    return [*argv, "--trainer", trainer_ref(trainer_class)]


def main(argv: Sequence[str] | None = None, *, trainer_class: type[Trainer] | None = None) -> int:
    """``titan-train``; ``trainer_class``: a Trainer subclass to run, as ``--trainer`` names one
    (torchtitan's ``main(trainer_class)``); it must live in an importable module when workers start."""
    with launcher_environment_kept():  # restored after the error is reported with the rehearsed rank's prefix
        return _main(list(sys.argv[1:] if argv is None else argv), trainer_class)


def _main(argv: list[str], trainer_class: type[Trainer] | None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if args.nproc_per_node is not None and args.nproc_per_node < 1:
            raise TitanError(f"--nproc-per-node {args.nproc_per_node}: give the number of processes to start "
                             f"on this machine, 1 or more (e.g. --nproc-per-node 2).")
        return run(args, rest, argv, trainer_class)
    except TitanError as exc:
        return _report(exc, with_traceback=args.traceback)
    except OSError as exc:  # the run folder, config.toml, metrics.jsonl, exports: a message naming the file

        return _report(describe_os_error(exc), with_traceback=args.traceback, cause=exc)
    except KeyboardInterrupt:
        if env_is_rank0() and not under_launcher():  # the launcher prints it once for all its workers
            print(INTERRUPTED, file=sys.stderr)
        return 130
    except Terminated:  # a phase that stops at once on SIGTERM, ended outside the trainer's own report
        if env_is_rank0():
            say("titan-train: stopped by SIGTERM")
        return 128 + signal.SIGTERM


def _report(exc: TitanError, *, with_traceback: bool, cause: BaseException | None = None) -> int:
    """One message (none from a rank that only followed another's stop), the documented exit code."""
    if with_traceback:
        traceback.print_exception(cause or exc)
    if getattr(exc, "quiet", False):
        return exc.exit_code

    if isinstance(exc, StopRequested):
        say(str(exc))
        return exc.exit_code

    if hand_to_launcher(str(exc), hint=not with_traceback):  # --nproc-per-node prints each message once
        return exc.exit_code
    hint = () if with_traceback else ("(run with --traceback to see where it happened)",)
    say(f"{rank_prefix()}titan-train: error: {exc}", *hint)
    return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def _names_a_spec(args: argparse.Namespace, rest: list[str]) -> bool:
    """Whether the command line chooses a spec (``--spec``, ``--model.spec``, or a ``--config`` that may)."""
    return bool(args.spec or args.config or any(a.startswith("--model.spec") for a in rest))
