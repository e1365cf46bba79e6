"""The parts ``DecisionRecorder`` (``service/store/recorder.py``) composes, one job each.

- ``memory_queue``: the decisions in memory, bounded in bytes and count; what is
  dropped, why, and the count of every decision's fate (written, refused, spilled,
  dropped) that ``flush`` waits on
- ``writer``: store writes on a call thread of their own, the store's state (up, down,
  stalled) and the retry policy (backoff, stall bound)
- ``spill_log``: appends to the spill file, whether it takes decisions now, and the
  lines set aside in ``<spill>.rejected``
- ``spill_drain``: the spill files drained back into the store, batch by batch
"""
