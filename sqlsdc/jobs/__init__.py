"""Back-end jobs: read confidential data through the engines, run the pure algorithms of
:mod:`sqlsdc.tabular` on aggregated cells, and store the results together with their ledger
rows and audit entry through :mod:`sqlsdc.catalog`.

* :mod:`sqlsdc.jobs.job` — the shared job steps (admin check, SQL check, inner cells in
  SQL, transactional store with ledger and audit); :mod:`sqlsdc.jobs.session`, the audited
  catalog opening every job (anonymisation and synthesis too) shares.
* :mod:`sqlsdc.jobs.protect` — the cell suppression job (``sqlsdc protect --method
  suppress``).
* :mod:`sqlsdc.jobs.adjust` — controlled rounding, controlled tabular adjustment and raking.
* :mod:`sqlsdc.jobs.patterns` — the suppression universes of the query path, protected and kept
  fresh in the catalog.

The algorithms below this layer use no database; everything that reads or writes one lives here
(or in the guard, for queries).
"""

import importlib

_NAMES = {
    "AdjustReport": "adjust",
    "cta_query": "adjust",
    "ipf_query": "adjust",
    "round_query": "adjust",
    "JobReport": "protect",
    "protect_query": "protect",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    """The jobs' names, imported on first use (PEP 562): the guard imports
    :mod:`sqlsdc.jobs.patterns`, and a query has no use for the jobs' solvers and their
    libraries (numba, OR-Tools), whose import was most of a CLI query's CPU (new user s40h)."""
    if name not in _NAMES:
        raise AttributeError(f"module 'sqlsdc.jobs' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sqlsdc.jobs.{_NAMES[name]}"), name)
