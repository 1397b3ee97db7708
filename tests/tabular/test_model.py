"""The table model: hierarchies, cells over all margins, X and A (hand-computed tables)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import TabularError
from sqlsdc.tabular.model import Hierarchy, Table, build_table, link_tables


@pytest.fixture
def small():
    """region × sex: a has (m 4, m 1, f 2), b has (m 3); cell (b, f) is empty."""
    return pd.DataFrame(
        {"region": ["a", "a", "a", "b"], "sex": ["m", "m", "f", "m"], "v": [4.0, 1.0, 2.0, 3.0]}
    )


# --- hierarchies --------------------------------------------------------------------------------


def test_hierarchy_from_parents_orders_codes_parents_first():
    h = Hierarchy.from_parents({"A": None, "A1": "A", "A2": "A", "B": "Total"})
    assert h.codes == ("Total", "A", "A1", "A2", "B")
    assert h.parents == {"Total": None, "A": "Total", "A1": "A", "A2": "A", "B": "Total"}
    assert h.children == {"Total": ("A", "B"), "A": ("A1", "A2"), "A1": (), "A2": (), "B": ()}
    assert h.depth.tolist() == [0, 1, 2, 2, 1]
    assert h.is_leaf.tolist() == [False, False, True, True, True]
    assert h.ancestor.tolist() == [[0, 0, 0, 0, 0], [-1, 1, 1, 1, 4], [-1, -1, 2, 3, -1]]


def test_hierarchy_flat_and_from_levels():
    assert Hierarchy.flat(["x", "y"], total="All").parents == {"All": None, "x": "All", "y": "All"}
    df = pd.DataFrame({"region": ["R2", "R1", "R1"], "muni": ["M3", "M2", "M1"]})
    h = Hierarchy.from_levels(df, ["region", "muni"])
    assert h.codes == ("Total", "R1", "M1", "M2", "R2", "M3")
    assert h.parents["M3"] == "R2" and h.parents["R1"] == "Total"


@pytest.mark.parametrize(
    ("parents", "message"),
    [
        ({"A": "Z"}, "code 'A' has parent 'Z', which is not a code of the hierarchy"),
        ({"A": "B", "B": "A"}, "the hierarchy has a cycle through codes"),
        ({"Total": "A", "A": None}, "the total code 'Total' cannot have a parent"),
    ],
)
def test_hierarchy_from_parents_errors(parents, message):
    with pytest.raises(TabularError, match=message):
        Hierarchy.from_parents(parents)


def test_hierarchy_from_levels_errors():
    two_parents = pd.DataFrame({"r": ["R1", "R2"], "m": ["M1", "M1"]})
    with pytest.raises(TabularError, match="code 'M1' of column 'm' has two parents"):
        Hierarchy.from_levels(two_parents, ["r", "m"])
    two_levels = pd.DataFrame({"r": ["X", "R2"], "m": ["M1", "X"]})
    with pytest.raises(TabularError, match="code 'X' appears in columns 'r' and 'm'"):
        Hierarchy.from_levels(two_levels, ["r", "m"])
    total_code = pd.DataFrame({"r": ["Total"], "m": ["M1"]})
    with pytest.raises(TabularError, match="contains the total code 'Total' as a data code"):
        Hierarchy.from_levels(total_code, ["r", "m"])
    with pytest.raises(TabularError, match="has missing codes"):
        Hierarchy.from_levels(pd.DataFrame({"r": ["R1", None]}), ["r"])


# --- a 2-D table with margins: every cell, every entry of X and A ------------------------------


def test_two_way_table_cells(small):
    t = build_table(small, ["region", "sex"], "v")
    c = t.cells
    assert c[["region", "sex"]].values.tolist() == [
        ["Total", "Total"], ["Total", "f"], ["Total", "m"], ["a", "Total"], ["a", "f"],
        ["a", "m"], ["b", "Total"], ["b", "m"],
    ]  # fmt: skip
    assert c["n"].tolist() == [4, 1, 3, 3, 1, 2, 1, 1]
    assert c["value"].tolist() == [10.0, 2.0, 8.0, 7.0, 2.0, 5.0, 3.0, 3.0]
    assert c["top1"].tolist() == [4.0, 2.0, 4.0, 4.0, 2.0, 4.0, 3.0, 3.0]
    assert c["top2"].tolist() == [3.0, 0.0, 3.0, 2.0, 0.0, 1.0, 0.0, 0.0]
    assert c["level"].tolist() == [0, 1, 1, 1, 2, 2, 1, 2]
    assert c["is_inner"].tolist() == [False] * 4 + [True, True, False, True]
    assert t.inner.tolist() == [4, 5, 7]
    assert not t.count and not t.weighted and not t.negative


def test_two_way_table_model_matrix(small):
    t = build_table(small, ["region", "sex"], "v")
    assert t.X.shape == (3, 8) and t.X.dtype == np.int8
    assert t.X.toarray().tolist() == [
        [1, 1, 0, 1, 1, 0, 0, 0],  # inner (a, f) lies below Total, (Total, f), (a, Total)
        [1, 0, 1, 1, 0, 1, 0, 0],  # inner (a, m)
        [1, 0, 1, 0, 0, 0, 1, 1],  # inner (b, m)
    ]
    inner_values = t.values[t.inner]
    assert (t.X.T @ inner_values).tolist() == t.values.tolist()


def test_two_way_table_constraint_matrix(small):
    t = build_table(small, ["region", "sex"], "v")
    assert t.A.shape == (6, 8) and t.A.dtype == np.float64
    assert t.A.toarray().tolist() == [
        [1, 0, 0, -1, 0, 0, -1, 0],  # Total = a + b
        [1, -1, -1, 0, 0, 0, 0, 0],  # Total = f + m
        [0, 1, 0, 0, -1, 0, 0, 0],  # (Total, f) = (a, f); (b, f) is empty
        [0, 0, 1, 0, 0, -1, 0, -1],  # (Total, m) = (a, m) + (b, m)
        [0, 0, 0, 1, -1, -1, 0, 0],  # (a, Total) = (a, f) + (a, m)
        [0, 0, 0, 0, 0, 0, 1, -1],  # (b, Total) = (b, m)
    ]
    assert (t.A @ t.values).tolist() == [0.0] * 6


def test_frequency_table_counts_records(small):
    t = build_table(small, ["region"])
    assert t.count
    assert t.cells[["region", "n", "value"]].values.tolist() == [
        ["Total", 4, 4.0], ["a", 3, 3.0], ["b", 1, 1.0],
    ]  # fmt: skip
    assert "top1" not in t.cells


def test_unbalanced_hierarchy_and_three_dimensions():
    rng = np.random.default_rng(3)
    df = pd.DataFrame(
        {
            "geo": rng.choice(["A1", "A2", "B"], 200),
            "sex": rng.choice(["f", "m"], 200),
            "age": rng.choice(["y", "o"], 200),
            "x": rng.integers(1, 100, 200).astype(float),
        }
    )
    geo = {"A": None, "A1": "A", "A2": "A", "B": None}
    t = build_table(df, ["geo", "sex", "age"], "x", hierarchies={"geo": geo})
    assert len(t.cells) == 5 * 3 * 3
    assert set(t.cells["geo"]) == {"Total", "A", "A1", "A2", "B"}
    assert np.allclose(t.A @ t.values, 0)
    assert np.allclose(t.X.T @ t.values[t.inner], t.values)
    assert t.cells.loc[0, "value"] == df["x"].sum() and t.cells.loc[0, "n"] == 200
    a_f = t.cells.query("geo == 'A' and sex == 'f' and age == 'Total'")
    sub = df[df.geo.isin(["A1", "A2"]) & (df.sex == "f")]
    assert a_f["value"].item() == sub["x"].sum()
    assert a_f["top1"].item() == sub["x"].max()
    # each parent code has one equation per combination of the other dimensions' codes
    assert t.A.shape[0] == (1 + 1) * 3 * 3 + 5 * 1 * 3 + 5 * 3 * 1


def test_level_columns_build_hierarchy():
    df = pd.DataFrame({"region": ["R1", "R1", "R2"], "muni": ["M1", "M2", "M3"], "v": [1.0, 2, 3]})
    t = build_table(df, ["muni"], "v", hierarchies={"muni": ["region", "muni"]})
    assert t.cells["muni"].tolist() == ["Total", "R1", "M1", "M2", "R2", "M3"]
    assert t.cells["value"].tolist() == [6.0, 3.0, 1.0, 2.0, 3.0, 3.0]
    assert t.parents()["muni"]["M3"] == "R2"


def test_units_are_summed_before_ranking():
    # unit 1 contributes 3 + 4 to two inner cells of region a; unit 2 gives 5
    df = pd.DataFrame({"geo": ["a1", "a2", "a1"], "u": [1, 1, 2], "v": [3.0, 4.0, 5.0]})
    h = {"geo": {"a": None, "a1": "a", "a2": "a"}}
    t = build_table(df, ["geo"], "v", hierarchies=h, unit="u")
    c = t.cells.set_index("geo")
    assert c.loc["a", "n"] == 2 and c.loc["Total", "n"] == 2
    assert c.loc["a", ["top1", "top2"]].tolist() == [7.0, 5.0]  # unit 1 summed over a1, a2
    assert c.loc["a1", ["n", "top1", "top2"]].tolist() == [2, 5.0, 3.0]


def test_holdings_group_units():
    df = pd.DataFrame(
        {
            "nace": ["x", "x", "x", "y"],
            "firm": [1, 2, 3, 4],
            "group": ["g1", "g1", None, "g1"],
            "v": [50.0, 30.0, 20.0, 10.0],
        }
    )
    t = build_table(df, ["nace"], "v", unit="firm", holding="group")
    c = t.cells.set_index("nace")
    assert c.loc["x", ["n", "n_holding", "htop1", "htop2"]].tolist() == [3, 2, 80.0, 20.0]
    assert c.loc["Total", ["n", "n_holding", "htop1", "htop2"]].tolist() == [4, 2, 90.0, 20.0]
    assert c.loc["y", ["n_holding", "htop1"]].tolist() == [1, 10.0]


def test_sampling_weights():
    df = pd.DataFrame({"g": ["a", "a", "b"], "v": [10.0, 4.0, 6.0], "w": [2.0, 3.0, 1.5]})
    t = build_table(df, ["g"], "v", weight="w")
    assert t.weighted
    c = t.cells.set_index("g")
    assert c.loc["a", ["n", "value", "weight"]].tolist() == [2, 32.0, 5.0]
    assert c.loc["a", ["top1", "top1_w", "top2", "top2_w"]].tolist() == [10.0, 2.0, 4.0, 3.0]
    assert c.loc["Total", ["value", "weight"]].tolist() == [41.0, 6.5]


def test_shadow_variable_and_negative_flag():
    df = pd.DataFrame({"g": ["a", "a"], "v": [-5.0, 9.0], "s": [5.0, 9.0]})
    assert build_table(df, ["g"], "v").negative
    t = build_table(df, ["g"], "v", shadow="s")
    assert not t.negative
    assert t.cells.loc[0, ["value", "shadow", "top1", "top2"]].tolist() == [4.0, 14.0, 9.0, 5.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dims": ["nope"]}, r"microdata has no column\(s\) \['nope'\]"),
        ({"dims": ["g"], "measure": "v", "weight": "w", "holding": "h"}, "cannot be combined"),
        ({"dims": ["g"], "measure": "v", "weight": "neg"}, "must be >= 0"),
        ({"dims": ["g"], "measure": "bad"}, "column 'bad' has missing values"),
        ({"dims": ["g"], "measure": "v", "unit": "u", "weight": "w"}, "weight varies within"),
        ({"dims": ["g"], "hierarchies": {"x": {}}}, "hierarchies given for"),
        ({"dims": ["g"], "hierarchies": {"g": {"a": None}}}, r"codes \['b'\] that are not in"),
        ({"dims": ["g"], "hierarchies": {"g": {"a": None, "b": "a"}}}, "not bottom-level codes"),
        ({"dims": ["g", "g"]}, "repeat a name"),
    ],
)
def test_build_table_errors(kwargs, message):
    df = pd.DataFrame(
        {
            "g": ["a", "b"], "v": [1.0, 2.0], "w": [1.0, 2.0], "h": ["x", "y"], "u": [1, 1],
            "neg": [1.0, -1.0], "bad": [1.0, None],
        }
    )  # fmt: skip
    with pytest.raises(TabularError, match=message):
        build_table(df, **kwargs)


def test_total_code_in_data_is_refused():
    df = pd.DataFrame({"g": ["Total", "b"], "v": [1.0, 2.0]})
    with pytest.raises(TabularError, match="contains the total code 'Total' as a data code"):
        build_table(df, ["g"], "v")
    assert build_table(df, ["g"], "v", total="All").cells["g"].tolist() == ["All", "Total", "b"]


# --- aggregated input ---------------------------------------------------------------------------


def test_from_cells_computes_margins_and_merges_top_contributions():
    inner = pd.DataFrame(
        {
            "r": ["a", "a", "b"],
            "s": ["f", "m", "m"],
            "value": [2.0, 5.0, 3.0],
            "n": [1, 2, 1],
            "top1": [2.0, 4.0, 3.0],
            "top2": [0.0, 1.0, 0.0],
        }
    )
    t = Table.from_cells(inner, ["r", "s"])
    c = t.cells.set_index(["r", "s"])
    assert c.loc[("Total", "Total"), ["n", "value", "top1", "top2"]].tolist() == [4, 10.0, 4, 3]
    assert c.loc[("Total", "m"), ["n", "value", "top1", "top2"]].tolist() == [3, 8.0, 4, 3]
    assert np.allclose(t.A @ t.values, 0) and t.X.shape == (3, 8)


def test_from_cells_checks_given_margins():
    cells = pd.DataFrame({"s": ["Total", "f", "m"], "value": [12.0, 7.0, 5.0], "n": [4, 3, 2]})
    t = Table.from_cells(cells, ["s"])
    assert t.cells["n"].tolist() == [4, 3, 2]  # the given margin frequency is kept
    cells.loc[0, "value"] = 13.0
    with pytest.raises(TabularError, match=r"is given as 13 but its inner cells add up to 12"):
        Table.from_cells(cells, ["s"])
    with pytest.raises(TabularError, match="duplicate cells"):
        Table.from_cells(pd.concat([cells, cells]), ["s"])
    with pytest.raises(TabularError, match="no inner cells"):
        Table.from_cells(cells.iloc[:1], ["s"], hierarchies={"s": {"f": None, "m": None}})


# --- linked tables ------------------------------------------------------------------------------


def test_link_tables_shares_cells_and_stacks_equations():
    df = pd.DataFrame(
        {"r": ["a", "b", "b"], "s": ["m", "f", "m"], "g": ["x", "x", "y"], "v": [1.0, 2, 3]}
    )
    t1, t2 = build_table(df, ["r", "s"], "v"), build_table(df, ["r", "g"], "v")
    t = link_tables([t1, t2])
    assert t.dims == ("r", "s", "g")
    assert len(t.cells) == len(t1.cells) + len(t2.cells) - 3  # Total, a, b margins shared
    shared = t.cells.query("s == 'Total' and g == 'Total'")
    assert shared[["r", "value"]].values.tolist() == [["Total", 6.0], ["a", 1.0], ["b", 5.0]]
    assert np.allclose(t.A @ t.values, 0)
    # the two tables' equations "Total = a + b" are one row
    assert t.A.shape[0] == t1.A.shape[0] + t2.A.shape[0] - 1
    # X over the cover table's inner cells (r, s, g): values = X.T @ cover values
    assert t.X.shape == (3, len(t.cells))
    assert np.allclose(t.X.T @ np.array([1.0, 2.0, 3.0]), t.values)
    assert t.inner.tolist() == [-1, -1, -1]  # cover cells are not cells of either table


def test_link_tables_rejects_disagreeing_cells():
    a = pd.DataFrame({"r": ["a", "b"], "v": [1.0, 2.0]})
    b = pd.DataFrame({"r": ["a", "b"], "v": [1.0, 5.0]})
    with pytest.raises(TabularError, match="linked tables disagree on cell"):
        link_tables([build_table(a, ["r"], "v"), build_table(b, ["r"], "v")])


def test_link_tables_with_two_hierarchies_of_one_dimension():
    df = pd.DataFrame({"r": ["a", "b", "c"], "v": [1.0, 2.0, 4.0]})
    t1 = build_table(df, ["r"], "v")
    t2 = build_table(
        df, ["r"], "v", hierarchies={"r": {"ab": None, "a": "ab", "b": "ab", "c": None}}
    )
    t = link_tables([t1, t2])
    assert t.cells["r"].tolist() == ["Total", "a", "ab", "b", "c"]
    assert t.hierarchies["r"] is None
    assert t.inner.tolist() == [1, 3, 4]
    assert np.allclose(t.A @ t.values, 0)
    assert t.A.toarray().tolist() == [[1, -1, 0, -1, -1], [1, 0, -1, 0, -1], [0, -1, 1, -1, 0]]


def test_build_is_vectorised():
    rng = np.random.default_rng(0)
    rows = 200_000
    muni = rng.integers(0, 60, rows)
    nace = rng.integers(0, 40, rows)
    df = pd.DataFrame(
        {
            "region": "R" + pd.Series(muni // 10).astype(str),
            "muni": "M" + pd.Series(muni).astype(str),
            "sec": "S" + pd.Series(nace // 8).astype(str),
            "nace": "N" + pd.Series(nace).astype(str),
            "size": "Z" + pd.Series(rng.integers(0, 8, rows)).astype(str),
            "v": rng.lognormal(3, 2, rows),
        }
    )
    start = time.perf_counter()
    t = build_table(
        df,
        ["muni", "nace", "size"],
        "v",
        hierarchies={"muni": ["region", "muni"], "nace": ["sec", "nace"]},
    )
    elapsed = time.perf_counter() - start
    assert len(t.cells) == 67 * 46 * 9
    assert np.allclose(t.A @ t.values, 0, atol=1e-6 * t.values.max())
    assert elapsed < 20  # ~1 s on one core; 10^6 cells from 3·10^6 rows take ~15 s
