"""summary.md of a scripts/gpu/checks.sh run, rewritten after every check.

Reads RUNS/order (the checks in plan order) and each check's folder: limit, expected, rc,
seconds, status (pass / fail: why / skipped: why), console.txt and, for titan-train runs,
metrics.jsonl. Prints the headline table first (tokens/s, MFU in both conventions, peak
memory, first-step seconds; ratios against the bf16 run of the same width), then one row per
check. Throughput figures are the median of the logging windows after the first two records
(step 1 pays for compiling, the first window for any recompile). In the cluster plan
(CHECKS_PLAN=cluster) it sets the dry run's memory plan of rank 0 (plan_70B's table) against
that rank's measured peak (rank_70B's metrics).
Usage: python scripts/gpu/summarize.py RUNS [--budget S --elapsed S]"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# The headline runs and what each is compared against (the same width, plain bf16 causal attention).
HEADLINE = {"bf16_1B": None, "float8_1B": "bf16_1B", "bf16_8B": None, "float8_8B": "bf16_8B",
            "flex_doc_masking": "bf16_1B", "moe_bf16": None}
WARM_RECORDS = 2  # step 1 (compile) and the first window


def text(path: Path, default: str = "") -> str:
    return path.read_text(errors="replace").strip() if path.is_file() else default


def records(run: Path) -> list[dict[str, float]]:
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [r for r in (json.loads(line) for line in lines if line.strip()) if "loss" in r]


def figures(run: Path) -> dict[str, float | None]:
    steps = records(run)
    steady = steps[WARM_RECORDS:] or steps[-1:]

    def median(key: str) -> float | None:
        values = [r[key] for r in steady if key in r]
        return statistics.median(values) if values else None

    memory = [r.get("mem_max_reserved_gib", r.get("mem_peak_rss_gib", 0.0)) for r in steps]
    first = next((r for r in steps if r["step"] == 1), None)
    return {
        "tokens/s": median("tokens_per_s"), "MFU causal": median("mfu"), "MFU full square": median("mfu_full_attention"),
        "peak GiB": max(memory) if memory else None, "first step s": first["step_time_s"] if first else None,
        "loss first": steps[0]["loss"] if steps else None, "loss last": steps[-1]["loss"] if steps else None,
        "grouped_mm share": steps[-1].get("moe_grouped_mm") if steps else None,
    }


def fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/")


def table(columns: list[str], rows: list[list[object]]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(fmt(v) for v in row) + " |" for row in rows)]


def last_line(run: Path) -> str:
    lines = [line for line in text(run / "console.txt").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def planned_rank(console: str, rank: int = 0) -> dict[str, float] | None:
    """The dry run's row of ``rank`` (its per-rank table: ``stage rank layers ... runtime live total fits``)."""
    lines = console.splitlines()
    header = next((i for i, line in enumerate(lines) if line.split()[:2] == ["stage", "rank"]), None)
    if header is None:
        return None
    columns = lines[header].split()
    for line in lines[header + 1:]:
        cells = line.split()
        if len(cells) != len(columns) or not cells[0].isdigit():
            break
        if int(cells[1]) == rank:
            row = dict(zip(columns, cells, strict=True))
            try:
                return {key: float(row[key].replace(",", "")) for key in ("live", "total", "runtime")}
            except (KeyError, ValueError):
                return None
    return None


def cluster_section(runs: Path) -> list[str]:
    """Plan against measurement for the rehearsed rank; the plan's fixed runtime allowance (CUDA context,
    NCCL) is taken off, since the allocator's figures never include it and a fake group has no NCCL."""
    plan = planned_rank(text(runs / "plan_70B" / "console.txt"))
    steps = records(runs / "rank_70B")
    if plan is None or not steps:
        return []
    out = ["## Cluster rehearsal: rank 0's memory plan against its measured peak", ""]
    rows: list[list[object]] = []
    pairs = [("mem_max_allocated_gib", "live", "peak allocated (CUDA)"),
             ("mem_max_reserved_gib", "total", "peak reserved (CUDA)"),
             ("mem_peak_rss_gib", "total", "peak resident set (CPU: the whole process; a plumbing check only)")]
    for key, column, label in pairs:
        measured = [r[key] for r in steps if key in r]
        if measured:
            planned = plan[column] - plan["runtime"]
            rows.append([label, f"{column} - runtime", planned, max(measured),
                         max(measured) / planned if planned > 0 else None])
    out += table(["measured", "plan column", "plan GiB", "measured GiB", "measured / plan"], rows)
    return [*out, ""]


def summary(runs: Path, *, budget: int | None, elapsed: int | None) -> str:
    order = list(dict.fromkeys(text(runs / "order").split()))
    statuses = {name: text(runs / name / "status", "running or killed") for name in order}
    counts = {kind: sum(s.startswith(kind) for s in statuses.values()) for kind in ("pass", "fail", "skipped")}
    out = [f"# titan-core GPU checks: {counts['pass']} pass, {counts['fail']} fail, {counts['skipped']} skipped"
           + (f" ({elapsed} s of the {budget} s budget)" if budget is not None else ""), ""]
    gpu = text(runs / "gpu.txt")
    if gpu:
        out += ["```", gpu, "```", ""]
    stats = {name: figures(runs / name) for name in HEADLINE if name in order}
    shown = [name for name, f in stats.items() if f["loss first"] is not None]
    if shown:
        columns = ["run", "tokens/s", "MFU causal", "MFU full square", "peak GiB", "first step s", "loss first",
                   "loss last", "grouped_mm share"]
        out += ["## Headline (steady logging windows)", ""]
        out += table(columns, [[name, *(stats[name][c] for c in columns[1:])] for name in shown])
        for name in shown:
            base = HEADLINE[name]
            a, b = stats[name]["tokens/s"], stats.get(base or "", {}).get("tokens/s")
            if base and a and b:
                out.append(f"- {name}: tokens/s {a / b:.3f}x of {base}")
        out.append("")
    if "rank_70B" in order:
        out += cluster_section(runs)
    rows = []
    for name in order:
        run = runs / name
        status = statuses[name]
        note = status.partition(": ")[2] if ":" in status else ""
        if status.startswith("fail"):
            note = f"{note}; last line: {last_line(run)}"
        rows.append([name, status.partition(":")[0], f"{text(run / 'rc', '-')} ({text(run / 'expected', '?')})",
                     f"{text(run / 'seconds', '-')} ({text(run / 'limit', '?')})", note])
    out += ["## Checks", ""]
    out += table(["check", "result", "exit code (expected)", "seconds (limit)", "note"], rows)
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", type=Path)
    parser.add_argument("--budget", type=int)
    parser.add_argument("--elapsed", type=int)
    args = parser.parse_args()
    print(summary(args.runs, budget=args.budget, elapsed=args.elapsed), end="")


if __name__ == "__main__":
    main()
