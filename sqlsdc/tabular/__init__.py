"""Table protection on aggregated cells: the table model, primary rules, secondary suppression and
its audit (issue 5), usable on pandas data without a database and as back-end jobs.

Example:
    >>> import pandas as pd
    >>> from sqlsdc.tabular import protect
    >>> df = pd.DataFrame({"region": list("aabbbcc"), "sex": list("mfmfmmf"),
    ...                    "income": [10.0, 80, 5, 7, 9, 4, 6]})
    >>> cells = protect(df, ["region", "sex"], "income")  # doctest: +SKIP
"""

import sys
import types

from sqlsdc.lazy import lazy_names

_NAMES = {
    "AuditReport": "api",
    "audit": "api",
    "protect": "api",
    "CTAReport": "cta",
    "cta": "cta",
    "publish_intervals": "cta",
    "IPFResult": "ipf",
    "ipf": "ipf",
    "mdi_adjust": "ipf",
    "Hierarchy": "model",
    "Table": "model",
    "build_table": "model",
    "link_tables": "model",
    "QualityReport": "quality",
    "quality": "quality",
    "RoundingResult": "rounding",
    "controlled_round": "rounding",
    "prf_uniforms": "rounding",
    "round_conventional": "rounding",
    "round_modified_conventional": "rounding",
    "round_unbiased": "rounding",
    "round_zero_restricted": "rounding",
}
__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)


class _Package(types.ModuleType):
    """``cta``, ``ipf`` and ``quality`` name a function and the module defining it: importing
    the module binds the package's name to the module (the import system's ``setattr``), and
    ``from sqlsdc.tabular import cta`` then gave a module once any job had imported
    :mod:`sqlsdc.tabular.cta`. The package keeps such names for its functions."""

    def __setattr__(self, name: str, value) -> None:
        if name in _NAMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
