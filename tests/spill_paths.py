"""Where a test's service keeps its spill file and decision log.

The service's default is the working directory for a database that is not an SQLite
file (``Settings.resolved_spill_path``): for a test run from the checkout that left a
decision log directory per PostgreSQL database in the checkout (245 of them after a few
runs), and a later run on the same database URL (the shared ``test`` database) would
take over a log a killed service of an earlier run had left and store its decisions
into that run's database. A test that names no spill path gets one in a directory of
this test process's own instead, named after the database URL as the default is: a
restart of the same database in the same test finds its log again, and nothing
outlives the process.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

_ROOT: Path | None = None


def _root() -> Path:
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="switchboard-test-spill-"))
        atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
    return _ROOT


def default_spill_path(database_url: str) -> str | None:
    """The spill path a service on ``database_url`` gets when its test names none; None
    for an SQLite file, whose default is beside the file (already the test's own)."""
    if database_url.startswith("sqlite:///") and ":memory:" not in database_url:
        return None
    digest = hashlib.sha256(database_url.encode()).hexdigest()[:12]
    return str(_root() / f"switchboard-spill-{digest}.jsonl")


def spill_setting(database_url: str) -> dict[str, str]:
    """``Settings`` fields for a service on ``database_url`` made in this process:
    ``default_spill_path`` unless the environment names a spill path already."""
    spill = default_spill_path(database_url)
    if spill is None or "SWITCHBOARD_SPILL_PATH" in os.environ:
        return {}
    return {"spill_path": spill}
