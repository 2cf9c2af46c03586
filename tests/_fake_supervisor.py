"""The fault-tolerance supervisor over stand-in replica groups (for tests/test_process_trees.py).

``python _fake_supervisor.py RUN_DIR QUORUM_TIMEOUT_S GRACE_S`` runs the real Supervisor, with the real
torchft lighthouse and the real spare, but each replica group is a small Python process that says
it started and then waits for ever (a group that never answers, unless killed). Its exit code is
the supervisor's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from titan_core.config.job import JobConfig
from titan_core.fault_tolerance import supervisor

STAND_IN = "import sys, time; print('stand-in group started', flush=True); time.sleep(10**6)"


def main() -> int:
    run_dir, quorum_timeout_s, grace_s = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    supervisor.STOP_GRACE_S = grace_s
    config = JobConfig.model_validate({"job": {"run_dir": str(run_dir)}, "fault_tolerance": {
        "local_replicas": 2, "quorum_timeout_s": quorum_timeout_s, "max_restarts": 0}})
    supervisor.Supervisor.child_command = lambda self, replica_id: [sys.executable, "-c", STAND_IN]  # type: ignore[method-assign]
    return supervisor.supervise(config, [])


if __name__ == "__main__":
    sys.exit(main())
