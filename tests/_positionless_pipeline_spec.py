"""``llama3-positionless-pp``: titan-llama's spec with a pipeline that does not declare it carries
the document positions (``pipeline_takes_positions=False``), as a third-party spec written before
that field existed would be. Imported by tests with ``--import tests._positionless_pipeline_spec``."""

from __future__ import annotations

import dataclasses

from titan_core import register_train_spec
from titan_llama.spec import llama3_spec

SPEC = dataclasses.replace(llama3_spec, name="llama3-positionless-pp", pipeline_takes_positions=False)
register_train_spec(SPEC)
