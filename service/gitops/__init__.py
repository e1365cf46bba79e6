"""Overrides as code: the fleet's rules and overrides declared in one file, exported
from live state, planned (a combined dry run from the recorded fleet) and applied in
one transaction. ``document`` is the file's shape, ``lines`` reads it with line
numbers, ``diff`` compares it with what is in force, ``proposal`` previews every
change together, ``planning`` answers plan and apply, ``drift`` says how live state
left the last applied file, ``sync`` and ``managed`` are the declarative mode (a
mounted file applied when it changes), ``cli`` and ``report`` are
``switchboard overrides``."""
