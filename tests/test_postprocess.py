"""Post-processing of protected results (:mod:`sqlsdc.guard.postprocess`)."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from sqlsdc.errors import InternalError
from sqlsdc.guard.postprocess import _LISTED_STATUS, check_faults
from sqlsdc.rewrite.cells import FAULT, PUBLISHED, SUPPRESSED


@pytest.mark.parametrize("rows", [1, _LISTED_STATUS, _LISTED_STATUS + 1, 5_000])
def test_a_faulty_cell_refuses_the_whole_result_at_any_size(rows):
    """Small results are searched as Python values, large ones with Arrow kernels: the same
    verdict either way, wherever the faulty cell is."""
    query = SimpleNamespace(status_columns={1: "__status"})
    fine = [PUBLISHED if i % 2 else SUPPRESSED for i in range(rows)]
    check_faults(pa.table({"v": range(rows), "__status": fine}), query)
    for where in {0, rows // 2, rows - 1}:
        faulty = fine[:where] + [FAULT] + fine[where + 1 :]
        with pytest.raises(InternalError, match="could not be protected"):
            check_faults(pa.table({"v": range(rows), "__status": faulty}), query)


def test_a_status_column_null_throughout_or_with_nulls_is_not_a_fault():
    query = SimpleNamespace(status_columns={0: "a", 1: "b"})
    table = pa.table({"a": pa.nulls(3, pa.string()), "b": [PUBLISHED, None, SUPPRESSED]})
    check_faults(table, query)
