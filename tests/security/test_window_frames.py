"""Window frames over protected cells (moving sums and averages, a BI staple): the frame reads
the released cells in the released order, like any window over cells, and its offsets must be
literals, since an offset computed from the cells could fail for some of them."""

from __future__ import annotations

import pytest

import sqlsdc

GROUPS = {
    "ages": ("age", "age < 40"),
    "small municipalities": ("municipality", "age = 30"),  # many cells suppressed (NULL)
}


def queries(key: str, where: str) -> tuple[str, str]:
    """The cells, and their moving average and neighbours' sum (window frames over them)."""
    cells = f"SELECT {key}, COUNT(*) AS n FROM persons WHERE {where} GROUP BY {key}"
    moving = (
        f"SELECT {key}, COUNT(*) AS n, AVG(COUNT(*)) OVER (ORDER BY {key} ROWS BETWEEN 2 "
        f"PRECEDING AND CURRENT ROW) AS ma, SUM(COUNT(*)) OVER (ORDER BY {key} GROUPS BETWEEN "
        f"1 PRECEDING AND 1 FOLLOWING EXCLUDE CURRENT ROW) AS around FROM persons "
        f"WHERE {where} GROUP BY {key} ORDER BY {key}"
    )
    return cells, moving


def expected(cells: list[tuple]) -> list[tuple]:
    """The moving average and neighbours' sum of the released counts, in Python."""
    cells = sorted(cells)
    counts = [n for _key, n in cells]
    out = []
    for i, (key, n) in enumerate(cells):
        window = [c for c in counts[max(0, i - 2) : i + 1] if c is not None]
        around = [c for c in counts[max(0, i - 1) : i] + counts[i + 1 : i + 2] if c is not None]
        mean = sum(window) / len(window) if window else None
        out.append((key, n, mean, sum(around) if around else None))
    return out


@pytest.mark.parametrize("groups", GROUPS)
@pytest.mark.parametrize("connection", ["ckm", "analyst"], ids=["cell key", "threshold"])
def test_a_frame_over_cells_is_a_function_of_the_released_cells(connection, groups, request):
    con = request.getfixturevalue(connection)
    cells, moving = queries(*GROUPS[groups])
    released = con.execute(cells).fetchall()
    framed = con.execute(moving).fetchall()
    assert len(framed) == len(released) > 30
    assert [(k, n, pytest.approx(m), s) for k, n, m, s in framed] == expected(released)
    if connection == "analyst" and groups == "small municipalities":
        assert any(n is None for _k, n in released)  # suppressed cells are framed as NULLs


@pytest.mark.parametrize(
    "frame",
    [
        "ROWS BETWEEN COUNT(*) - 600 PRECEDING AND CURRENT ROW",  # fails where a count < 600
        "ROWS BETWEEN age PRECEDING AND CURRENT ROW",
        "ROWS BETWEEN -1 PRECEDING AND CURRENT ROW",
        "ROWS BETWEEN CAST(SUM(income) AS BIGINT) PRECEDING AND CURRENT ROW",
        "RANGE BETWEEN (SELECT 1) PRECEDING AND CURRENT ROW",
    ],
)
def test_frame_offsets_must_be_literals(ckm, frame):
    sql = f"SELECT age, SUM(COUNT(*)) OVER (ORDER BY age {frame}) FROM persons GROUP BY age"
    with pytest.raises(sqlsdc.PolicyViolation, match="window frame|subquer"):
        ckm.execute(sql)


def test_frames_stay_refused_over_rows(ckm):
    """A frame does not make a window over confidential rows an aggregate."""
    with pytest.raises(sqlsdc.PolicyViolation, match="window functions over confidential"):
        ckm.execute(
            "SELECT COUNT(*) FROM (SELECT SUM(income) OVER (ORDER BY income ROWS BETWEEN 1 "
            "PRECEDING AND CURRENT ROW) AS s FROM persons) AS t"
        )
