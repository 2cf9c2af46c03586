"""What the benchmark scripts share: their command line (run them as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import argparse


def int_parser(doc: str | None, **defaults: int) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring, with one integer option per keyword:
    ``seq_len=2048`` gives ``--seq-len`` (default 2048). Add any other option to it."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    return parser
