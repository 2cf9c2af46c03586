"""The process around a run: signals, deadlines, the launcher and its environment, locks, and how a
process reports failures (a lost peer, out of memory, a worker's error) and exits.

Light on imports (the CLIs import parts of it before torch), and below every component: it imports
only ``errors`` and ``console``.
"""
