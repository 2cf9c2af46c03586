"""Run titan-core's conformance checks on this spec (what `titan-plugin check tinygpt` runs)."""

from titan_core.testing import TrainSpecConformance


class TestTinygpt(TrainSpecConformance):
    train_spec = "tinygpt"
    fast = True  # the quick subset; set False (or run `titan-plugin check tinygpt`) for every check
