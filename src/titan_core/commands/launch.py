"""``titan-train --nproc-per-node N``: re-launch this command through torch.distributed.run."""

from __future__ import annotations


def _strip_nproc(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            out.append(arg)
    return out


def relaunch(nproc: int, argv: list[str]) -> int:
    """Run ``torchrun --standalone --nproc-per-node N -m titan_core <same args>``; its exit code."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = torchrun.get_args_parser().parse_args(
        ["--nproc-per-node", str(nproc), "--standalone", "-m", "titan_core", *_strip_nproc(argv)]
    )
    try:
        torchrun.run(args)
    except ChildFailedError as exc:  # the workers already printed their own errors
        codes = [f.exitcode for f in exc.failures.values() if f.exitcode > 0]
        return max(codes) if codes else 1
    return 0
