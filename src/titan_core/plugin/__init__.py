"""The plugin contract, as the core implements it: what a TrainSpec and a ModelConverter are
(``protocols``), the signatures of every factory a spec may supply and of what they return
(``spec_factories``), entry-point discovery with its API-version check (``discovery``,
``entry_points``), the guard every call into plugin code runs under (``guard``), the section
names reserved for the core (``section_names``), and helpers a plugin calls: module selection
for converters (``selection``), a converter's ``emulate`` setting (``emulation``), and a spec
function imported on first call (``deferred``).

The public statement of the contract is ``titan_core.plugin_api``. May import ``models``,
``config``, ``runtime`` and the leaves; never a component, never a plugin.
"""
