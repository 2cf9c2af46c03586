"""The plan: a run's config resolved against the installed plugins, above every component.

``resolve_config`` loads the requested plugins, validates the config with their sections, and
derives once what every path needs (device, backend, tokenizer, model args); the Trainer,
``--dry-run``, the launcher's preflight and the conformance kit read the result.

May import ``weights``, ``hf``, ``boundary`` and everything below them; ``train`` and ``commands``
use it.
"""
