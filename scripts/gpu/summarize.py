"""One markdown row per titan-train run folder: exit code, losses, steady step time, tokens/s,
MFU and peak memory, read from each run's metrics.jsonl; ratios against the bf16 run of the
same shape. Usage: python scripts/gpu/summarize.py RUNS_DIR"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

WARMUP_STEPS = 3  # the first steps build kernels (and compile); they are left out of the medians


def steps_of(run: Path) -> list[dict[str, float]]:
    """The run's step records; for a --compare-baseline run, those of its converted run."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        path = run / "converted" / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if "loss" in r]


def row(run: Path) -> dict[str, object]:
    steps = steps_of(run)
    rc = (run / "rc").read_text().strip() if (run / "rc").is_file() else "?"
    steady = steps[WARMUP_STEPS:] or steps

    def median(key: str) -> float | None:
        return statistics.median(r[key] for r in steady) if steady and key in steady[0] else None

    console = (run / "console.txt").read_text(errors="replace") if (run / "console.txt").is_file() else ""
    last_line = next((line for line in reversed(console.splitlines()) if line.strip()), "")
    return {
        "run": run.name, "rc": rc, "steps": len(steps),
        "loss first": steps[0]["loss"] if steps else None, "loss last": steps[-1]["loss"] if steps else None,
        "step s": median("step_time_s"), "tokens/s": median("tokens_per_s"), "MFU": median("mfu"),
        "max alloc GiB": max((r.get("mem_max_allocated_gib", 0.0) for r in steps), default=None),
        "last line": last_line[:160] if rc != "0" else "",
    }


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/")


def main(runs_dir: Path) -> None:
    rows = [row(run) for run in sorted(p for p in runs_dir.iterdir() if p.is_dir())]
    if not rows:
        print(f"no runs under {runs_dir}")
        return
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(fmt(r[c]) for c in columns) + " |")
    by_name = {r["run"]: r for r in rows}
    for name, r in by_name.items():
        base = by_name.get("bf16_1B_compiled" if name.endswith("_compiled") else "bf16_1B")
        if name.startswith("float8") and "1B" in name and base and r["tokens/s"] and base["tokens/s"]:
            print(f"- {name}: tokens/s {r['tokens/s'] / base['tokens/s']:.3f}x of {base['run']}")
    compare = runs_dir / "float8_compare" / "compare.jsonl"
    if compare.is_file():
        records = [json.loads(line) for line in compare.read_text().splitlines()]
        losses = {(r["run"], r["step"]): r["loss"] for r in records if "loss" in r}
        last = max(step for _, step in losses)
        a, b = losses.get(("converted", last)), losses.get(("baseline", last))
        if a is not None and b is not None:
            print(f"- float8_compare: step {last} loss {a:.4f} vs baseline {b:.4f}, relative gap {abs(a - b) / abs(b):.2e}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
