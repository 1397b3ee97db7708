"""Microdata protection and risk (issue 20): pure algorithms on arrays and DataFrames, no database.

* :mod:`~sqlsdc.microdata.microaggregation` — MDAV (whole or partitioned), V-MDAV, a
  better-than-MDAV optimiser, IL = 100·SSE/SST
  and IL1s;
* :mod:`~sqlsdc.microdata.risk` — sample frequencies fk, population estimates Fk, k-anonymity
  violations, the Benedetti–Franconi individual risk, global risk;
* :mod:`~sqlsdc.microdata.ldiversity` — distinct, entropy and recursive l-diversity of
  sensitive variables in the key classes (sdcMicro's ``ldiversity``);
* :mod:`~sqlsdc.microdata.pram` — PRAM matrices (nE, nB, nF, invariant), draws, unbiased
  counts and their variance;
* :mod:`~sqlsdc.microdata.perturb` — correlated noise, rank swapping, top/bottom coding,
  global recoding, local suppression to k-anonymity;
* :mod:`~sqlsdc.microdata.steps` — the step language of ``sqlsdc anonymize``, keyed draws.

The jobs that read and store data are in :mod:`sqlsdc.jobs.anonymize`.
"""

from sqlsdc.microdata.microaggregation import (
    MicroaggregationResult,
    il1s,
    improve,
    information_loss,
    mdav,
    microaggregate,
    standardise,
    vmdav,
)
from sqlsdc.microdata.risk import (
    RiskSummary,
    frequencies,
    individual_risk,
    k_anonymity_violations,
    risk_summary,
)

__all__ = [
    "MicroaggregationResult",
    "RiskSummary",
    "frequencies",
    "il1s",
    "improve",
    "individual_risk",
    "information_loss",
    "k_anonymity_violations",
    "mdav",
    "microaggregate",
    "risk_summary",
    "standardise",
    "vmdav",
]
