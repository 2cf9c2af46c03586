"""A plugin written against titan-core plugin API 1.0 as its documentation stood: it reads every
field the 1.0 contract documented, and maps the enumerated ones through its own tables of the
documented values, as a plugin author would (a value outside a table is a KeyError)."""
