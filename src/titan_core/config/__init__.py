"""The schema: every core section (``sections``), ``JobConfig`` and its cross-field checks
(``job``),
config files and their layers (``layers``), ``--section.key=value`` flags (``overrides``),
validation
messages (``messages``), numbers torch can hold (``finite``), booleans refused where a number is
wanted (``booleans``), settings this machine refuses (``environment``), TOML output (``toml_out``),
the fault-tolerance section (``fault_tolerance``) and the parallel degrees checked against the world
size with the named device mesh (``parallel_dims``).

May import ``runtime`` and the leaves only: everything else reads the config, the config reads
nothing.
"""
