"""``python -m mla_switchboard.cli``: the ``switchboard`` program."""

from mla_switchboard.cli import main

raise SystemExit(main())
