"""The demo database: a synthetic population with a ready policy (:mod:`sqlsdc.demo.build`).

The defaults live here, free of heavy imports, so that ``sqlsdc demo --help`` shows them
without loading the engine.
"""

DEFAULT_PERSONS = 1_000_000
DEFAULT_SEED = 20260101
