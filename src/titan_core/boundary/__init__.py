"""The one door into plugin code: ``plugin_boundary`` wraps a spec's functions (``SpecCalls``), a
converter's hooks (``ConverterCalls``) and a state-dict adapter (``CheckedAdapter``) so that each
call runs under the guard (``plugin.guard``) and its result is checked before the core uses it;
``meta_model`` builds a spec's model on the meta device through that door.

May import the components, ``plugin``, ``models``, ``config``, ``runtime``; ``hf``, ``weights``,
``plan`` and ``train`` sit above it.
"""
