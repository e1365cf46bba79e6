"""The parts ``DecisionRecorder`` (``service/store/recorder.py``) composes, one job each.

- ``segments``: the log's on-disk format (checksummed records in numbered segments,
  the mark file), reading it back, and what a start finds missing
- ``log``: the log itself: group-committed appends, new segments synced with their
  directory, the mark written and stored segments removed
- ``drainer``: database writes, the store's state (failing, stalled) and the backoff
"""
