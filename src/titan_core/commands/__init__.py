"""The entry points: one module per console script (``titan_train``, ``titan_plugin``, ``convert``,
``data_prepare``, ``generate``, ``report``) and per ``titan-train`` mode (``train``, ``dry_run``,
``list_plugins``, ``launch``, ``compare``, ``plugin_check``, ``trainer_class``). Each turns argv
into a
request and hands it to the package that does the work.

May import every package; nothing imports it but ``__main__``."""
