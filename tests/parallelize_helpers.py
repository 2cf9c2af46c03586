"""A spec's ``parallelize_fn`` applied on one process, as the tests of AC, TP plans and specs call it: the
core's ``titan_core.parallel.one_process`` (the benchmarks use it too), under the names the tests import."""

from __future__ import annotations

from titan_core.parallel.one_process import parallel_kwargs, parallelize_alone

__all__ = ["parallel_kwargs", "parallelize_alone"]
