"""The one version string: the installed distribution's metadata.

The service's OpenAPI document, ``switchboard --version`` and the agent's user agent
all read it from here, so a release bump in ``pyproject.toml`` is the only edit.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "mla-switchboard"
PROGRAM = "switchboard"
"""The program's name: its command, its root logger, its cache folder, and the actor
of the changes the service makes itself. Our own kernels' engine shares the word but
is another fact (``core.engines.OWN_ENGINE``)."""


def _installed_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


__version__ = _installed_version()
