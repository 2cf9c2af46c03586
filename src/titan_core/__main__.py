"""``python -m titan_core`` (what torchrun runs) is ``titan-train``."""

from .commands.titan_train import main
from .runtime.worker_exit import exit_process

exit_process(main())
