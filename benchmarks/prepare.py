"""``titan-data prepare`` as a user runs it, against the fastest way to do the same tokenizing.

    python benchmarks/prepare.py [--mb 100] [--rounds 3] [--workers 1,2] [--startup-repeats 7]

Throughput: the command (a subprocess, start-up included: ``titan-data prepare CORPUS
--tokenizer builtin --out DIR --workers N``) against the bare loop: N processes, each a script
that builds the same tokenizer with tiktoken alone (the built-in ranks, split pattern and special
tokens: tiktoken encodes half as fast with no special tokens at all) and
runs ``encode_to_numpy`` over its 1/N of the corpus lines (``json.loads`` of each line first, as
any reader of a .jsonl must), timed from launch to the last exit. Each round runs both sides
for every N, in alternating order (bare first in odd rounds, the command first in even ones),
so a change of the machine's load hits both alike; printed per N: the median of the rounds'
ratios (command tokens/s / bare tokens/s), their spread (min..max), each side's tokens/s and
CPU seconds, and the load average before and after. The bare loop's own encode-only time
(its start-up and JSON parsing left out) is printed beside it as the strictest yardstick.
Target: median ratio >= 0.85 at 1 and 2 workers.

Start-up: the median of ``--startup-repeats`` interleaved runs of ``python -c pass``, the
tokenizer load (``import tiktoken, numpy`` and building the built-in tokenizer: what the bare
loop pays before its first token; numpy because ``encode_to_numpy`` returns its arrays),
``titan-data prepare --help`` and a prepare of one small file. Target: each command at most
1.3x the tokenizer load.

The corpus is generated here (no download): documents of 50-2000 words, each a run of words
from the built-in corpus starting at a seeded random place, one JSON object per line, at least
``--mb`` MB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The bare loop: tiktoken alone, the built-in tokenizer's ranks and split pattern (argv), one byte range.
BARE = r"""
import base64, json, sys, time
import tiktoken
path, pattern, specials, corpus = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
start, end = int(sys.argv[5]), int(sys.argv[6])
with open(path, "rb") as f:
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}
# The special tokens too: without any, tiktoken's search for them costs as much again as the encoding.
enc = tiktoken.Encoding("builtin", pat_str=pattern, mergeable_ranks=ranks,
                        special_tokens={s: len(ranks) + i for i, s in enumerate(specials)})
with open(corpus, "rb") as f:
    f.seek(start)
    lines = f.read(end - start).splitlines()
tokens = docs = 0
encode_s = 0.0
for line in lines:
    text = json.loads(line)["text"]
    if not text:
        continue
    t = time.perf_counter()
    tokens += enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=()).size
    encode_s += time.perf_counter() - t
    docs += 1
print(tokens, docs, encode_s)
"""
LOAD_ONLY = r"""
import base64, json, sys
import numpy, tiktoken
with open(sys.argv[1], "rb") as f:
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}
tiktoken.Encoding("builtin", pat_str=sys.argv[2], mergeable_ranks=ranks,
                  special_tokens={s: len(ranks) + i for i, s in enumerate(json.loads(sys.argv[3]))})
"""


def make_corpus(path: Path, mb: float, seed: int = 0) -> None:
    from titan_core.data.corpus import builtin_documents

    words = " ".join(builtin_documents()).split(" ")
    rng = random.Random(seed)
    size = 0
    with path.open("w") as f:
        while size < mb * 1e6:
            n = rng.randint(50, 2000)
            start = rng.randrange(len(words) - n)
            line = json.dumps({"text": " ".join(words[start : start + n])}) + "\n"
            f.write(line)
            size += len(line)


def line_cuts(path: Path, parts: int) -> list[tuple[int, int]]:
    """``parts`` byte ranges of whole lines covering the file."""
    size = path.stat().st_size
    cuts = [0]
    with path.open("rb") as f:
        for k in range(1, parts):
            f.seek(max(cuts[-1], size * k // parts))
            f.readline()
            cuts.append(f.tell())
    cuts.append(size)
    return list(zip(cuts[:-1], cuts[1:]))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def titan_data() -> list[str]:
    """The console script as installed beside this Python (``python -m`` of its module if it is not there)."""
    script = Path(sys.executable).parent / "titan-data"
    return [str(script)] if script.exists() else [sys.executable, "-m", "titan_core.commands.data_prepare"]


class Bench:
    def __init__(self, corpus: Path, tmp: Path) -> None:
        from titan_core.data.tokenizer import BUILTIN_PATH, BUILTIN_SPECIAL_TOKENS, LLAMA3_PATTERN

        self.corpus, self.tmp = corpus, tmp
        self.tokenizer = [str(BUILTIN_PATH), LLAMA3_PATTERN, json.dumps(list(BUILTIN_SPECIAL_TOKENS))]

    def bare(self, workers: int) -> dict[str, float]:
        cpu, start = children_cpu(), time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", BARE, *self.tokenizer, str(self.corpus), str(a), str(b)],
                                  stdout=subprocess.PIPE, text=True)
                 for a, b in line_cuts(self.corpus, workers)]
        outs = [p.communicate()[0].split() for p in procs]
        wall = time.perf_counter() - start
        if any(p.returncode for p in procs):
            sys.exit("the bare loop failed")
        tokens, docs = sum(int(o[0]) for o in outs), sum(int(o[1]) for o in outs)
        encode_s = max(float(o[2]) for o in outs)
        # The command writes [BOS] doc [EOS]: the same count of tokens for the rate.
        return {"wall": wall, "tokens": tokens + 2 * docs, "cpu": children_cpu() - cpu, "encode_s": encode_s}

    def command(self, workers: int) -> dict[str, float]:
        out = self.tmp / f"out-{workers}"
        shutil.rmtree(out, ignore_errors=True)
        cpu, start = children_cpu(), time.perf_counter()
        subprocess.run([*titan_data(), "prepare", str(self.corpus), "--tokenizer", "builtin", "--out", str(out),
                        "--workers", str(workers), "--quiet"], check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        tokens = json.loads((out / "index.json").read_text())["num_tokens"]
        shutil.rmtree(out)
        return {"wall": wall, "tokens": tokens, "cpu": children_cpu() - cpu}


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def throughput(bench: Bench, workers: list[int], rounds: int) -> None:
    results: dict[int, list[tuple[dict[str, float], dict[str, float]]]] = {n: [] for n in workers}
    print(f"load average (1, 5, 15 min) before: {load()}")
    for r in range(rounds):
        for n in workers:
            if r % 2 == 0:
                b = bench.bare(n)
                c = bench.command(n)
            else:
                c = bench.command(n)
                b = bench.bare(n)
            if b["tokens"] != c["tokens"]:
                sys.exit(f"the bare loop counted {b['tokens']} tokens, the command wrote {c['tokens']}")
            results[n].append((b, c))
        print(f"  round {r + 1} done; load average {load()}")
    print(f"load average after: {load()}")
    print(f"{'workers':>7} {'bare tok/s':>12} {'command tok/s':>14} {'ratio median':>13} {'spread':>12} "
          f"{'bare CPU s':>11} {'cmd CPU s':>10} {'vs encode-only':>15}")
    for n, pairs in results.items():
        ratios = [b["wall"] / c["wall"] for b, c in pairs]
        bare_rate = statistics.median(b["tokens"] / b["wall"] for b, _ in pairs)
        cmd_rate = statistics.median(c["tokens"] / c["wall"] for _, c in pairs)
        encode_only = statistics.median(c["tokens"] / c["wall"] / (b["tokens"] / b["encode_s"]) for b, c in pairs)
        print(f"{n:>7} {bare_rate:>12,.0f} {cmd_rate:>14,.0f} {statistics.median(ratios):>13.3f} "
              f"{min(ratios):>5.3f}..{max(ratios):<5.3f} {statistics.median(b['cpu'] for b, _ in pairs):>11.2f} "
              f"{statistics.median(c['cpu'] for _, c in pairs):>10.2f} {encode_only:>15.3f}")
    print("ratio: command tokens/s / bare loop tokens/s, each wall-clock from launch to exit, per round; "
          "vs encode-only: against the bare loop's time inside encode_to_numpy alone (the slowest of its processes)")


def startup(bench: Bench, repeats: int) -> None:
    small = bench.tmp / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"a small document number {i}"}) + "\n" for i in range(20)))
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "tokenizer load": [sys.executable, "-c", LOAD_ONLY, *bench.tokenizer],
        "titan-data prepare --help": [*titan_data(), "prepare", "--help"],
        "prepare of one small file": [*titan_data(), "prepare", str(small), "--tokenizer", "builtin", "--out",
                                      str(bench.tmp / "small-out"), "--quiet"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, cmd in commands.items():
            shutil.rmtree(bench.tmp / "small-out", ignore_errors=True)
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["tokenizer load"])
    print(f"start-up, median of {repeats} interleaved runs (load average now {load()}):")
    print(f"{'command':<28} {'median s':>9} {'min s':>7} {'/ tokenizer load':>17}")
    for name, samples in times.items():
        print(f"{name:<28} {statistics.median(samples):>9.3f} {min(samples):>7.3f} "
              f"{statistics.median(samples) / base:>17.2f}")
    print("tokenizer load: python -c pass + import tiktoken and numpy + the built-in tokenizer built; target <= 1.3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=100.0, help="corpus size in MB (generated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2])
    parser.add_argument("--startup-repeats", type=int, default=7)
    parser.add_argument("--dir", default=None, help="where the corpus and the shards are written (default: temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="titan-bench-prepare-", dir=args.dir) as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        make_corpus(corpus, args.mb)
        lines = sum(1 for _ in corpus.open("rb"))
        print(f"corpus: {corpus.stat().st_size / 1e6:.1f} MB, {lines:,} documents of 50-2000 words (generated); "
              f"{os.cpu_count()} CPUs; {' '.join(titan_data())}")
        bench = Bench(corpus, Path(tmp))
        startup(bench, args.startup_repeats)
        throughput(bench, args.workers, args.rounds)


if __name__ == "__main__":
    main()
