"""What a run shows: the console line, ``metrics.jsonl`` and W&B (``metrics``), TensorBoard
(``tensorboard_writer``), the profiler window (``profiling``), and the HTML report of one or more
runs (``report/``).

May import ``plugin``, ``models``, ``config``, ``runtime`` and the leaves; independent of the
other components (``checkpoint``, ``data``, ``parallel``).
"""
