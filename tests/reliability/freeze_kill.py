"""kill -9 of a real replica at a random moment after its database froze, in rounds.

Each round: load on the replica (threads posting ``/v1/select``), the private
PostgreSQL SIGSTOPped, a kill -9 ``kill_after`` seconds later (random), the database
resumed. The next round's replica starts on the same spill path, so its start stores
what the killed one's decision log holds past its mark before it serves; once it is
ready, the killed round's answers are looked up in the database. A decision answered
more than ``GRACE_S`` before the kill and not stored is lost.

Shared by ``tests/reliability/test_log_kill9.py`` (3 rounds) and
``bench/kill9_freeze.py`` (20 rounds, bench/results/kill9_freeze.json).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.conftest import ServiceProcess
from tests.reliability.conftest import PrivatePostgres, SelectLoad, stored_decision_ids

GRACE_S = 0.1  # answered longer ago than this before the kill: must be kept


@dataclass
class Round:
    kill_after_s: float  # the kill, this long after the freeze (or the warm-up)
    answered: int
    answered_in_freeze: int
    lost: int  # of all answered
    lost_before_grace: int  # answered more than GRACE_S before the kill
    oldest_lost_ms: float  # the oldest lost answer's age at the kill

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def freeze_kill_rounds(
    pg: PrivatePostgres,
    tmp_path: Path,
    rounds: int,
    *,
    threads: int = 4,
    pause_s: float = 0.0,
    warmup: int = 200,
    kill_after: tuple[float, float] = (0.05, 0.4),
    seed: int = 0,
    env: dict[str, str] | None = None,
    freeze: bool = True,
    root: Path | None = None,
) -> list[Round]:
    """``freeze`` False: the kill comes ``kill_after`` into the load with the database
    up (the writer busy, not stalled). ``root``: the replicas run another checkout's
    code (a benchmark beside an older version)."""
    rng = random.Random(seed)
    env = {"SWITCHBOARD_SPILL_PATH": str(tmp_path / "volume" / "spill.jsonl"), **(env or {})}
    service = ServiceProcess(pg.url, env=env, root=root).start(tmp_path)
    out: list[Round] = []
    try:
        for i in range(rounds):
            cluster = f"fk{seed}r{i}"
            load = SelectLoad([service.url], cluster=cluster, threads=threads, pause_s=pause_s)
            after = rng.uniform(*kill_after)
            assert service.proc is not None
            try:
                load.start()
                load.wait_for(warmup)
                if freeze:
                    pg.freeze()
                frozen = time.monotonic()
                time.sleep(after)
                service.proc.kill()
                killed = time.monotonic()
                service.proc.wait(10)
            finally:
                load.stop()
                pg.thaw()
            # the next replica's start replays what this one left, before it serves
            service = ServiceProcess(pg.url, env=env, root=root).start(tmp_path)
            stored = stored_decision_ids(pg.url, cluster)
            pairs = zip(load.times, load.answers, strict=True)
            answered = [(t, d) for t, d in pairs if t <= killed]
            lost = [(killed - t, d) for t, d in answered if d not in stored]
            out.append(
                Round(
                    kill_after_s=round(after, 3),
                    answered=len(answered),
                    answered_in_freeze=sum(1 for t, _ in answered if t > frozen),
                    lost=len(lost),
                    lost_before_grace=sum(1 for age, _ in lost if age > GRACE_S),
                    oldest_lost_ms=round(max((age for age, _ in lost), default=0.0) * 1000, 1),
                )
            )
    finally:
        service.stop()
    return out
