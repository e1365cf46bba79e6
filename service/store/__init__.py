"""The service's storage: one module per resource, and ``Store``, their thin facade.

- ``config``: rules and overrides (and the snapshot the hot path reads)
- ``tokens``: API tokens
- ``audit``: the audit trail written by every admin write
- ``decisions``: recorded decisions and each pod's latest
- ``measurements``: benchmark reports and failure reports (evidence)

The value types they hand out live in ``service.state``, outside the store.
"""

from __future__ import annotations

from mla_switchboard.service.store.facade import Store

__all__ = ["Store"]
