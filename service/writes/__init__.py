"""Admin writes: overrides, rules, tokens, cleared failures. Each is one transaction
with its audit entry, previewed first where it changes decisions, and answered with
what really happened:

- a stale ``If-Match`` is a 412 and changes nothing;
- with an ``Idempotency-Key``, a retry after a lost answer gets the first answer
  (kept in the write's own transaction) instead of a second change, and a key reused
  for another request is refused;
- once the commit went through, the answer says so, even when this replica cannot
  reload its configuration right after (the database went away): the change is
  stored and audited, and the replica applies it at its next poll;
- a failure *during* the commit is answered as such: the change may or may not be
  stored, and the same Idempotency-Key tells which.

Routes parse and format; these modules decide and call the store: overrides and
rollouts (``overrides.py``), rules (``rules.py``), tokens (``tokens.py``), cleared
failures (``evidence.py``), sharing ``flow.py``.
"""

from mla_switchboard.service.writes.flow import IDEMPOTENCY_KEY_PATTERN, IdempotencyKey
from mla_switchboard.service.writes.overrides import audit_counts
from mla_switchboard.service.writes.rules import scoped_merge

__all__ = ["IDEMPOTENCY_KEY_PATTERN", "IdempotencyKey", "audit_counts", "scoped_merge"]
