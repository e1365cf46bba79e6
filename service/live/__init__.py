"""Live updates: the in-memory configuration snapshot and the poller that keeps every
replica's copy current (``poller``), the changes between two snapshots (``changes``),
and the stream that sends them to consoles (``events``). Nothing here writes the
database: a change arrives the same way whichever replica made it.
"""
