"""Fault tolerance with torchft replica groups (docs/fault-tolerance.md).

``config`` (the section, importable without torchft), ``replica`` (the torchft Manager
around one replica group), ``trainer`` (the Trainer whose step follows the quorum),
``shards`` (a group's DTensor state sent as local shards), ``diloco`` (the outer step),
``supervisor`` (the local lighthouse + K groups launcher) and ``spare`` (its pre-imported
restart process), ``rehearsal`` (test-only hooks). torchft is imported only when
``fault_tolerance.enable`` is on.

May import ``train`` and everything below it; only ``commands`` imports it.
"""
