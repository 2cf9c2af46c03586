"""``titan-data``: corpus tools. ``titan-data prepare SOURCE... --tokenizer TOK --out DIR [--workers N]``
tokenizes sources into memory-mappable shards for ``--data.source=tokens:DIR`` (docs/data.md); the
pipeline is ``data/prepare/``, this module only turns the command line into its request.

A bad input is one message and exit 2, before anything is written; Ctrl+C exits 130 and
SIGTERM 143, keeping the finished shards (the same command continues from them).
Nothing on this path imports torch (tests/test_data_shards.py checks it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ..runtime.path_settings import remember_tool_paths
from .help_format import HelpFormatter
from .tool_main import run_tool


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="titan-data", description="Prepare corpora for titan-train.",
                                formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="tokenize sources into token shards + index.json (for tokens:DIR)",
                          formatter_class=HelpFormatter)
    prep.add_argument("sources", nargs="+", metavar="SOURCE",
                      help="a .txt/.jsonl/.json/.parquet file or folder, builtin, or hf:<name> (as data.source)")
    prep.add_argument("--tokenizer", required=True, help="as data.tokenizer: builtin or a tokenizer.model path")
    prep.add_argument("--out", required=True, type=Path, help="the folder to write (new, or an unfinished prepare)")
    prep.add_argument("--workers", type=int, default=1, help="tokenizer processes (default 1)")
    prep.add_argument("--shard-tokens", type=int, default=1 << 26, help="tokens per shard file (default 2^26, at most 2^31)")
    prep.add_argument("--text-field", default="text", help="field holding the text in .jsonl/.json/.parquet rows")
    prep.add_argument("--hf-split", default="train", help="split of an hf: dataset")
    prep.add_argument("--allow-download", action="store_true", help="permit hf: sources to download")
    prep.add_argument("--hf-timeout", type=float, default=60.0, metavar="SECONDS",
                      help="seconds an hf: source may go without delivering a row before prepare stops (default 60)")
    prep.add_argument("--keep-duplicates", action="store_true",
                      help="also pack a file that is a link to, or a byte-identical copy of, a file already read "
                           "(skipped and named by default)")
    prep.add_argument("--quiet", action="store_true", help="no progress line")
    prep.add_argument("--traceback", action="store_true", help="show Python tracebacks for errors")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))

    def command(args: argparse.Namespace) -> int:
        from ..data.prepare import PrepareRequest, prepare  # start-up: --help and a bad flag need no numpy
        from ..plan.tokenizer import build_tokenizer  # start-up: nor the tokenizer (tiktoken)

        # A full disk then advises titan-data's own --out (not a titan-train flag) and says what is kept.
        remember_tool_paths([("--out", args.out)], unnamed="--out",
                            kept=f"The finished shards in {args.out} are kept: the same command continues.")

        req = PrepareRequest(sources=list(args.sources), tokenizer=args.tokenizer, out=args.out, workers=args.workers,
                             shard_tokens=args.shard_tokens, text_field=args.text_field, hf_split=args.hf_split,
                             allow_download=args.allow_download, progress=not args.quiet,
                             hf_timeout_s=args.hf_timeout, keep_duplicates=args.keep_duplicates)
        index = prepare(req, build_tokenizer)
        print(f"{args.out}: {index['num_tokens']:,} tokens, {index['num_documents']:,} documents, "
              f"{len(index['shards'])} shard(s), {index['dtype']}; train with --data.source=tokens:{args.out}")
        return 0

    return run_tool("titan-data", command, args,
                    on_stop=f"the finished shards in {args.out} are kept, the same command continues")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
