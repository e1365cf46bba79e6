"""Extract each engine release's MLA prefill rules from the release's own code."""

from pathlib import Path

TABLES = Path(__file__).resolve().parent / "data"
"""Each release's table, ``<engine>/<release>.json``: what the tools write and the tests
hold the core's rules to. Kept out of the package: no running code reads them (the
rules in ``core/engine_rules/`` are their compact form)."""
