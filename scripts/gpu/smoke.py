"""The first check of scripts/gpu/checks.sh: versions, and every titan module imported (the
checks' 4 training steps follow in checks.sh). Exit 1, naming what failed, when a module does
not import or the device asked for is missing. Usage: python scripts/gpu/smoke.py --device cuda"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import pkgutil
import platform
import sys
import traceback

PACKAGES = ("titan_core", "titan_llama", "titan_qwen3", "titan_float8", "titan_mx_prototype")
# Packages a module may need that the run does not (test helpers for plugin authors, extras):
# a module that needs one of these and does not find it is listed, not a failure.
OPTIONAL = {"pytest", "wandb", "datasets", "tensorboard"}
DISTRIBUTIONS = ("titan-core", "titan-llama", "titan-qwen3", "titan-float8", "titan-mx-prototype", "torch",
                 "triton", "torchao", "pydantic", "numpy", "safetensors")


def version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def import_all(package: str) -> tuple[int, list[str]]:
    """(modules imported, failures as 'module: error') for ``package`` and every module under it."""
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")
                         if not m.name.endswith("__main__")]  # __main__ runs the command line
    failures = []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name not in OPTIONAL:
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
                traceback.print_exc()
            else:
                print(f"{name}: not imported, needs the optional package {exc.name}")
        except Exception as exc:  # noqa: BLE001  (every failure is reported, then the check fails)
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    return len(names), failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    import torch

    print(f"python {platform.python_version()} | " + " | ".join(f"{d} {version(d)}" for d in DISTRIBUTIONS))
    print(f"torch cuda build {torch.version.cuda} | cuda available {torch.cuda.is_available()}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("smoke: CUDA was asked for, but torch sees no CUDA device", file=sys.stderr)
            return 1
        print(f"device {torch.cuda.get_device_name()} | capability {torch.cuda.get_device_capability()} | "
              f"memory {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
    failures: list[str] = []
    for package in PACKAGES:
        count, failed = import_all(package)
        print(f"{package}: {count - len(failed)} of {count} modules imported")
        failures += failed
    for failure in failures:
        print(f"smoke: import failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
