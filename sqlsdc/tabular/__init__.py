"""Table protection on aggregated cells: the table model, primary rules, secondary suppression and
its audit (issue 5), usable on pandas data without a database and as back-end jobs.

Example:
    >>> import pandas as pd
    >>> from sqlsdc.tabular import protect
    >>> df = pd.DataFrame({"region": list("aabbbcc"), "sex": list("mfmfmmf"),
    ...                    "income": [10.0, 80, 5, 7, 9, 4, 6]})
    >>> cells = protect(df, ["region", "sex"], "income")  # doctest: +SKIP
"""

from sqlsdc.tabular.api import AuditReport, audit, protect
from sqlsdc.tabular.cta import CTAReport, cta, publish_intervals
from sqlsdc.tabular.ipf import IPFResult, ipf, mdi_adjust
from sqlsdc.tabular.model import Hierarchy, Table, build_table, link_tables
from sqlsdc.tabular.quality import QualityReport, quality
from sqlsdc.tabular.rounding import (
    RoundingResult,
    controlled_round,
    prf_uniforms,
    round_conventional,
    round_modified_conventional,
    round_unbiased,
    round_zero_restricted,
)

__all__ = [
    "AuditReport",
    "CTAReport",
    "Hierarchy",
    "IPFResult",
    "QualityReport",
    "RoundingResult",
    "Table",
    "audit",
    "build_table",
    "controlled_round",
    "cta",
    "ipf",
    "link_tables",
    "mdi_adjust",
    "prf_uniforms",
    "protect",
    "publish_intervals",
    "quality",
    "round_conventional",
    "round_modified_conventional",
    "round_unbiased",
    "round_zero_restricted",
]
