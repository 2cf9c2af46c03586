"""``python -m titan_core`` (what torchrun runs) is ``titan-train``."""

import sys

from .cli import main

sys.exit(main())
