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
from sqlsdc.tabular.model import Hierarchy, Table, build_table, link_tables

__all__ = ["AuditReport", "Hierarchy", "Table", "audit", "build_table", "link_tables", "protect"]
