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

from sqlsdc.lazy import lazy_names

_NAMES = {
    "AdjustReport": "adjust",
    "cta_query": "adjust",
    "ipf_query": "adjust",
    "round_query": "adjust",
    "JobReport": "protect",
    "protect_query": "protect",
}
__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
