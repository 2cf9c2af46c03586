"""Run titan-core's conformance checks on this converter (what `titan-plugin check int8fake` runs)."""

from titan_core.testing import ConverterConformance


class TestInt8fake(ConverterConformance):
    converter = "int8fake"
    fast = True  # the quick subset; set False (or run `titan-plugin check int8fake`) for every check
