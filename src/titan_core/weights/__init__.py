"""Starting weights: ``checkpoint.initial_load`` (a Hugging Face folder or a titan checkpoint),
the shape it gives the model, and the model args a checkpoint was saved with.

Above ``hf/`` (folders, adapters, the export) and ``checkpoint/`` (the reading machinery);
the Trainer, ``--dry-run`` and ``titan-convert`` use it.

May import ``hf``, ``boundary`` and everything below them.
"""
