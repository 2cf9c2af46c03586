"""Start-up cost of ``titan-train --help`` / ``--list`` relative to ``python -c "import torch"``.

Runs each command N times interleaved (so machine noise hits all of them alike) and
prints the median wall time and the ratio to the torch import. Target: <= 1.3x.
Also checks that neither command imports torchao.

    python benchmarks/startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "import torch": [sys.executable, "-c", "import torch"],
    "titan-train --help": [sys.executable, "-m", "titan_core", "--help"],
    "titan-train --list": [sys.executable, "-m", "titan_core", "--list"],
}
TORCHAO_CHECK = (
    "import sys; from titan_core.commands.titan_train import main; main([{flag!r}]); "
    "print('TORCHAO_IMPORTED' if 'torchao' in sys.modules else 'TORCHAO_NOT_IMPORTED', file=sys.stderr)"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, cmd in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["import torch"])
    print(f"{'command':<22} {'median s':>9} {'ratio':>7}")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"{name:<22} {med:>9.3f} {med / base:>7.2f}")
    for flag in ("--help", "--list"):
        proc = subprocess.run([sys.executable, "-c", TORCHAO_CHECK.format(flag=flag)], capture_output=True, text=True)
        print(f"torchao imported by {flag}: {'TORCHAO_IMPORTED' in proc.stderr}")


if __name__ == "__main__":
    main()
