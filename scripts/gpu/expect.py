"""Assert a figure of a run's metrics.jsonl: the last record that has KEY must hold VALUE ("any":
present at all). Exit 1 naming what was found otherwise. Used by scripts/gpu/checks.sh, e.g. that
the MoE experts ran torch._grouped_mm: python scripts/gpu/expect.py RUN/metrics.jsonl moe_grouped_mm 1"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: Path, key: str, want: str) -> int:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    found = [r[key] for r in records if key in r]
    if not found:
        print(f"expect: no record of {path} has {key}", file=sys.stderr)
        return 1
    if want != "any" and float(found[-1]) != float(want):
        print(f"expect: {key} is {found[-1]} in the last record of {path}, expected {want}", file=sys.stderr)
        return 1
    print(f"expect: {key} = {found[-1]} ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
