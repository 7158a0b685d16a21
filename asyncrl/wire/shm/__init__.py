"""Shared memory between the learner and the actors on its host, one module per part:

- ``layout``: the byte layout of a ring's segment (header, control block, slots) and the check of
  a segment's header; ``ShmError``, ``ShmSpaceError``.
- ``ring``: ``SlotRing``, S rollout slots in one segment, and slot integrity (``WriteGuard``).
- ``dev_shm``: /dev/shm itself: free space, segment names (created exclusively, attached without
  the resource tracker), clean-up of stale segments and of a run's.
- ``ledger``: ``SlotLedger``, the learner's bookkeeping of which slot is free, granted, full or
  being consumed.

Nothing is re-exported here: import from the module that defines a name.
"""
