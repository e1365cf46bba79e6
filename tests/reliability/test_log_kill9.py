"""The decision log against a real replica: kill -9 while the database is frozen.

Without a local log, a kill -9 0.1-0.2 s after a freeze lost up to 171 decisions
answered up to 564 ms before it. Every answer is on local disk within a few ms
(``recording/log.py``), whatever the drainer's write in flight does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.conftest import PrivatePostgres
from tests.reliability.freeze_kill import freeze_kill_rounds

pytestmark = pytest.mark.postgres


@pytest.mark.serial
def test_kill9_in_a_frozen_database_keeps_every_answer_older_than_100ms(
    pg: PrivatePostgres, tmp_path: Path
) -> None:
    rounds = freeze_kill_rounds(pg, tmp_path, 3, threads=4, warmup=150, seed=1)
    for r in rounds:
        print(f"\n{r}")
    assert all(r.answered_in_freeze > 0 for r in rounds)
    assert sum(r.lost_before_grace for r in rounds) == 0, rounds
