"""The process around a run: signals, deadlines, the launcher and its environment, locks, and how a
process reports failures (a lost peer, out of memory, a worker's error) and exits.

Light on imports (the CLIs import parts of it before torch), and below every component: it imports
only ``errors`` and ``console``.

Also the run folder's files (``run_files``), folder locks (``run_lock``, ``folder_locks``, and
``folder_kinds``, which tells a checkpoint or an HF folder by its marker files), an ``OSError``
named by its file and setting (``os_errors``, ``path_settings``) and atomic publishing of a folder
(``folder_publish``).
"""
