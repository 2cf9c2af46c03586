"""Fault tolerance with torchft replica groups (docs/fault-tolerance.md).

``config`` (the section, importable without torchft), ``replica`` (the torchft Manager
around one replica group), ``trainer`` (the Trainer whose step follows the quorum),
``supervisor`` (the local lighthouse + K groups launcher). torchft is imported only
when ``fault_tolerance.enable`` is on.
"""
