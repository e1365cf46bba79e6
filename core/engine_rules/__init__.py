"""Each serving engine's rules as data, one module per engine (``core/engines.py`` lists them)."""
