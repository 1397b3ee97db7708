"""Maximum-entropy ptables against the R package ptable and τ-ARGUS's published tables.

Published numbers used here:
- the ptable 1.0 vignette (cran/ptable inst/doc/introduction.html): create_cnt_ptable(D=2, V=1),
  (D=2, V=0.9), (D=4, V=1, pstay=...), (D=5, V=3, js=2);
- τ-ARGUS's test ptables (sdcTools/tauargus data/cellkey/...): ptab_freq.txt (counts D=5, V=3,
  js=2, pstay=0.5), ptab_savings_all.txt (magnitudes D=5, V=1, step=2, icat=(1, 5)),
  ptab_savings_smallcells.txt (D=8, V=2, step=2, icat=(1, 8)) and tau_testW_ptable.txt (counts
  D=7, V=4, js=2, optim=4).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from sqlsdc import Error
from sqlsdc.mechanisms.ptable import (
    PTable,
    PTableError,
    PTableParams,
    PTableRow,
    count_ptable,
    magnitude_ptable,
    small_cells_ptable,
)
from sqlsdc.mechanisms.ptable_files import from_csv, from_tauargus, to_csv, to_tauargus

# τ-ARGUS data/cellkey/Magnitude/ptab_freq.txt: create_cnt_ptable(D=5, V=3, js=2, pstay=0.5)
PTAB_FREQ = """i;j;p;v;p_int_ub
0;0;1;0;1
1;0;0.73446954;-1;0.73446954
1;3;0.13672019;2;0.87118973
1;4;0.07279631;3;0.94398604
1;5;0.03742956;4;0.9814156
1;6;0.0185844;5;1
2;0;0.40880704;-2;0.40880704
2;3;0.40664356;1;0.8154506
2;4;0.14762399;2;0.96307459
2;5;0.03231882;3;0.99539341
2;6;0.00426687;4;0.99966028
2;7;0.00033972;5;1
3;0;0.18737598;-3;0.18737598
3;3;0.5;0;0.68737598
3;4;0.15629816;1;0.84367414
3;5;0.09081388;2;0.93448801
3;6;0.04324201;3;0.97773003
3;7;0.01687388;4;0.99460391
3;8;0.00539609;5;1
4;0;0.09146068;-4;0.09146068
4;3;0.1534042;-1;0.24486488
4;4;0.5;0;0.74486488
4;5;0.10745598;1;0.85232086
4;6;0.07288274;2;0.9252036
4;7;0.04296852;3;0.96817212
4;8;0.02201951;4;0.99019163
4;9;0.00980837;5;1
5;0;0.03934302;-5;0.03934302
5;3;0.10580374;-2;0.14514677
5;4;0.1142707;-1;0.25941746
5;5;0.5;0;0.75941746
5;6;0.09122979;1;0.85064725
5;7;0.06743799;2;0.91808523
5;8;0.04393229;3;0.96201753
5;9;0.02522171;4;0.98723924
5;10;0.01276076;5;1
6;3;0.09063278;-3;0.09063278
6;4;0.09217047;-2;0.18280325
6;5;0.09217047;-1;0.27497372
6;6;0.5;0;0.77497372
6;7;0.07126272;1;0.84623644
6;8;0.05759409;2;0.90383053
6;9;0.04378668;3;0.94761721
6;10;0.03131516;4;0.97893236
6;11;0.02106764;5;1
7;3;0.03393943;-4;0.03393943
7;4;0.05458754;-3;0.08852697
7;5;0.0760716;-2;0.16459858
7;6;0.09185269;-1;0.25645127
7;7;0.5;0;0.75645127
7;8;0.0871066;1;0.84355787
7;9;0.06841336;2;0.91197123
7;10;0.0465555;3;0.95852672
7;11;0.02744993;4;0.98597665
7;12;0.01402335;5;1
8;3;0.01158491;-5;0.01158491
8;4;0.02539548;-4;0.03698039
8;5;0.04675981;-3;0.0837402
8;6;0.07231718;-2;0.15605737
8;7;0.09394263;-1;0.25
8;8;0.5;0;0.75
8;9;0.09394263;1;0.84394263
8;10;0.07231718;2;0.91625981
8;11;0.04675979;3;0.96301961
8;12;0.02539548;4;0.98841508
8;13;0.01158492;5;1
"""

# τ-ARGUS data/cellkey/Magnitude/ptab_savings_all.txt: create_num_ptable(D=5, V=1, step=2,
# icat=c(1, 5)); note the "6.691E-05" notation, which the reader must accept.
PTAB_SAVINGS_ALL = """i;j;p;v;p_int_ub;type
0;0;1;0;1;all
1;0;0.24006614;-1;0.24006614;all
1;0.5;0.24006614;-0.5;0.48013228;all
1;1;0.24006615;0;0.72019843;all
1;1.5;0.10377025;0.5;0.82396868;all
1;2;0.06682983;1;0.89079851;all
1;2.5;0.04250929;1.5;0.9333078;all
1;3;0.02670627;2;0.96001407;all
1;3.5;0.01657137;2.5;0.97658544;all
1;4;0.01015593;3;0.98674137;all
1;4.5;0.00614748;3.5;0.99288885;all
1;5;0.00367527;4;0.99656412;all
1;5.5;0.0021702;4.5;0.99873432;all
1;6;0.00126568;5;1;all
5;0;0.00000074;-5;0.00000074;all
5;0.5;0.000008;-4.5;0.00000874;all
5;1;0.00006691;-4;0.00007565;all
5;1.5;0.00043635;-3.5;0.000512;all
5;2;0.00221596;-3;0.00272796;all
5;2.5;0.00876423;-2.5;0.01149219;all
5;3;0.02699563;-2;0.03848782;all
5;3.5;0.06475894;-1.5;0.10324676;all
5;4;0.12098539;-1;0.22423215;all
5;4.5;0.17603243;-0.5;0.40026458;all
5;5;0.19947079;0;0.59973537;all
5;5.5;0.17603246;0.5;0.77576783;all
5;6;0.12098542;1;0.89675325;all
5;6.5;0.06475896;1.5;0.96151221;all
5;7;0.02699563;2;0.98850784;all
5;7.5;0.00876421;2.5;0.99727205;all
5;8;0.00221595;3;0.999488;all
5;8.5;0.00043635;3.5;0.99992435;all
5;9;6.691E-05;4;0.99999126;all
5;9.5;8E-06;4.5;0.99999926;all
5;10;7.4E-07;5;1;all
"""

# τ-ARGUS data/cellkey/Frequency/tau_testW_ptable.txt (an older export: quoted header, p_ij_ub),
# rows i=0 and i=1 of create_cnt_ptable(D=7, V=4, js=2, optim=4).
TESTW_HEAD = """"i";"j";"p";"v";"p_ij_ub"
0;0;1;0;1
1;0;0.775078850966306;-1;0.775078851
1;3;0.0873643732150699;2;0.8624432242
1;4;0.0507561027140072;3;0.9131993269
1;5;0.0323385880305859;4;0.9455379149
1;6;0.0225960604169355;5;0.9681339753
1;7;0.0173150304125461;6;0.9854490058
1;8;0.0145509942445495;7;1
"""
TESTW_ROW_10 = [0.000442322417578984, 0.00223758007215499, 0.00882072767153136,
                0.0270967044207853, 0.0648656439098926, 0.121003854700935, 0.175901639860718,
                0.199263054403837, 0.175901639502279, 0.121003854551231, 0.0648656436716429,
                0.0270967043606954, 0.00882072798999298, 0.0022375798904412,
                0.000442322576283315]  # fmt: skip

# ptab_savings_smallcells.txt, row i=1 of create_num_ptable(D=8, V=2, step=2, icat=c(1, 8)):
# its targets cannot spread to V=2 (variance 1.1101), which R keeps.
SMALLCELLS_ROW_1 = [0.24385038, 0.24385039, 0.24385038, 0.09817932, 0.06229716, 0.03952907,
                    0.02508215, 0.01591524, 0.01009861, 0.00640781, 0.00406591, 0.00257992,
                    0.00163702, 0.00103873, 0.0006591, 0.00041822, 0.00026537, 0.00016838,
                    0.00010684]  # fmt: skip

# The vignette's transition matrix of create_cnt_ptable(D=5, V=3, js=2) (unrounded p).
VIGNETTE_D5_V3_JS2 = {
    1: [0.73446954, 0.136720190, 0.07279631, 0.03742956, 0.018584399],
    2: [0.40880704, 0.406643537, 0.14762401, 0.03231882, 0.004266868, 0.0003397188],
    5: [0.02014749, 0.173347467, 0.22063302, 0.22131828, 0.174967643, 0.1090164652, 0.053532830,
        0.020717693, 0.006319113],
    8: [0.003791861, 0.01659093, 0.05229263, 0.118730368, 0.1941934608, 0.228801496, 0.194193460,
        0.118730371, 0.052292634, 0.016590928, 0.00379186],
}  # fmt: skip


def column(entries, name):
    return np.array([getattr(e, name) for e in entries])


def assert_same_table(ours: PTable, published: PTable, tol: float):
    """Same rows, targets and noises; p and the intervals within the solver tolerance."""
    assert ours.classes == published.classes
    for i in published.classes:
        a, b = ours.row(i), published.row(i)
        for name in ("j", "v"):
            np.testing.assert_array_equal(column(a, name), column(b, name))
        for name in ("p", "p_int_lb", "p_int_ub"):
            np.testing.assert_allclose(column(a, name), column(b, name), rtol=0, atol=tol)


def test_vignette_d2_v09_ptable_row_by_row():
    rows = [(i, e.j, e.v, e.p_int_lb, e.p_int_ub) for i in (0, 1, 2)
            for e in count_ptable(D=2, V=0.9).row(i)]  # fmt: skip
    published = [  # ptab_new@pTable in the vignette
        (0, 0, 0, 0.0, 1.0),
        (1, 0, -1, 0.0, 0.3625), (1, 1, 0, 0.3625, 0.725), (1, 2, 1, 0.725, 0.9125),
        (1, 3, 2, 0.9125, 1.0),
        (2, 0, -2, 0.0, 0.05154609), (2, 1, -1, 0.05154609, 0.29536173),
        (2, 2, 0, 0.29536173, 0.70463827), (2, 3, 1, 0.70463827, 0.94845391),
        (2, 4, 2, 0.94845391, 1.0),
    ]  # fmt: skip
    assert [r[:3] for r in rows] == [r[:3] for r in published]
    np.testing.assert_allclose([r[3:] for r in rows], [r[3:] for r in published], atol=2e-8)


def r_formulation_by_slsqp(v, V, mono, optim):
    """R's pt_optim_entropy handed to scipy's SLSQP instead of nloptr: x0 = 1, objective
    sum x log2 x with R's gradient log2 x + 1, bounds [1e-8, 1], monotony left of v = 0."""
    v = np.asarray(v, dtype=float)
    cons = [{"type": "eq", "fun": lambda x: [x.sum() - 1, v @ x]}]
    var = {"type": "eq" if optim == 4 else "ineq", "fun": lambda x: [V - (v * v) @ x]}
    cons.append(var)
    zero = int(np.flatnonzero(v == 0)[0]) if mono and 0 in v else 0
    if zero:
        cons.append({"type": "ineq", "fun": lambda x: x[1 : zero + 1] - x[:zero]})
    res = minimize(
        lambda x: (x @ np.log2(x), np.log2(x) + 1),
        np.ones(v.size),
        jac=True,
        method="SLSQP",
        bounds=[(1e-8, 1)] * v.size,
        constraints=cons,
        options={"ftol": 1e-14, "maxiter": 500},
    )
    return res.x


@pytest.mark.parametrize(
    "D, V, js, optim, mono",
    [(2, 1, 0, 1, True), (4, 2, 1, 1, True), (5, 3, 2, 1, False), (3, 1.5, 0, 4, True)],
)
def test_rows_match_rs_programme_solved_by_scipy_slsqp(D, V, js, optim, mono):
    # An independent solver of the same programme: every row agrees to SLSQP's tolerance.
    pt = count_ptable(D=D, V=V, js=js, optim=optim, mono=mono)
    for i in pt.classes[1:]:
        ours = column(pt.row(i), "p")
        theirs = r_formulation_by_slsqp(column(pt.row(i), "v"), V, mono, optim)
        np.testing.assert_allclose(ours, theirs, atol=1e-6, err_msg=f"row {i}")


def test_vignette_d2_v1_row_1_cannot_reach_v():
    pt = count_ptable(D=2, V=1)
    np.testing.assert_allclose(
        column(pt.row(1), "p"), [0.36648551, 0.3664855, 0.1675725, 0.09945652], atol=1e-7
    )
    np.testing.assert_allclose(
        column(pt.row(2), "p"),
        [0.06382714, 0.2446915, 0.3829628, 0.24469145, 0.06382714],
        atol=1e-7,
    )
    check = pt.self_check()  # empResults: p_var 0, 0.93188, 1; iter 0, 20, 1
    np.testing.assert_allclose(check["p_var"], [0, 0.93188, 1], atol=1e-5)
    assert check["iter"].tolist() == [0, 20, 1]
    assert check["var_reached"].tolist() == [None, False, True]
    assert pt.variance(10**6) == pytest.approx(1, abs=1e-6)  # large counts use the last row


def test_vignette_d5_v3_js2_transition_matrix():
    pt = count_ptable(D=5, V=3, js=2)
    assert pt.ncat == pt.max_i == 8  # D + js + 1
    for i, p in VIGNETTE_D5_V3_JS2.items():
        np.testing.assert_allclose(column(pt.row(i), "p"), p, atol=1e-6)


@pytest.mark.parametrize(
    "pstay, expected",
    [(0.5, [0.5] * 4), ((0.5, 0.5, 0.7, 0.8), [0.5, 0.5, 0.7, 0.8])],  # vignette empResults
)
def test_pstay_is_honoured(pstay, expected):
    check = count_ptable(D=4, V=1, pstay=pstay).self_check()
    np.testing.assert_allclose(check["p_stay"][1:], expected, atol=1e-7)
    np.testing.assert_allclose(check["p_var"][1:], 1, atol=1e-6)
    assert check["iter"][1:].tolist() == [1] * 4


def test_pstay_is_relaxed_in_steps_of_005_when_v_needs_it():
    # p_stay >= 0.9 leaves too little mass to reach V=1; R lowers the bound by 0.05 per round.
    check = count_ptable(D=3, V=1, pstay=0.9).self_check()
    np.testing.assert_allclose(check["p_var"][1:], 1, atol=1e-6)
    np.testing.assert_allclose(check["p_stay"][1:], [0.45, 0.65, 0.75], atol=1e-7)
    assert check["iter"][1:].tolist() == [10, 6, 4]


def test_tauargus_ptab_freq_is_reproduced():
    published = from_tauargus(PTAB_FREQ)
    ours = count_ptable(D=5, V=3, js=2, pstay=0.5)
    assert_same_table(ours, published, tol=5e-8)
    assert ours.self_check()["p_stay"][3:].tolist() == pytest.approx([0.5] * 6, abs=1e-8)


def test_tauargus_magnitude_table_is_reproduced():
    published = from_tauargus(PTAB_SAVINGS_ALL)
    assert published.table == "nums" and published.type == "all"
    assert_same_table(magnitude_ptable(D=5, V=1, step=2, icat=(1, 5)), published, tol=2e-7)


def test_tauargus_optim_4_table_is_reproduced():
    ours = count_ptable(D=7, V=4, js=2, optim=4)
    head = from_tauargus(TESTW_HEAD)
    np.testing.assert_allclose(column(ours.row(1), "p"), column(head.row(1), "p"), atol=1e-7)
    np.testing.assert_allclose(column(ours.row(10), "p"), TESTW_ROW_10, atol=1e-7)
    check = ours.self_check()
    assert set(check["var_rule"][1:]) == {"="} and all(check["var_reached"][1:])
    # with variance <= V, row 1's maximum-entropy solution stays below V: a different table
    assert count_ptable(D=7, V=4, js=2).variance(1) < 4 - 1e-3


def test_magnitude_row_that_cannot_reach_v_is_kept_as_in_r():
    pt = magnitude_ptable(D=8, V=2, step=2, icat=(1, 8))
    np.testing.assert_allclose(column(pt.row(1), "p"), SMALLCELLS_ROW_1, atol=2e-7)
    check = pt.self_check()
    assert check["p_var"].tolist() == pytest.approx([0, 1.110132, 2], abs=1e-5)
    assert check["var_reached"].tolist() == [None, False, True]


@pytest.mark.parametrize(
    "D, V, js, mono",
    [(1, 0.5, 0, True), (3, 1.5, 0, True), (4, 2, 1, True), (5, 3, 2, False), (6, 2.5, 2, True)],
)
def test_every_row_is_unbiased_with_variance_at_most_v(D, V, js, mono):
    pt = count_ptable(D=D, V=V, js=js, mono=mono)
    check = pt.self_check()
    assert np.all(np.abs(check["p_mean"]) < 1e-6)
    assert np.all(check["p_var"] <= V + 1e-6)
    assert check["p_var"].iloc[-1] == pytest.approx(V, abs=1e-6)  # the symmetric row reaches V
    assert all(check["js_ok"]) and all(check["mono_ok"])


def test_js_blocks_small_targets_and_zero_stays_zero():
    pt = count_ptable(D=6, V=5, js=3)
    assert pt.classes == tuple(range(0, 11))  # D + js + 1 = 10
    assert [(e.j, e.p) for e in pt.row(0)] == [(0, 1.0)]
    for i in pt.classes[1:]:
        targets = column(pt.row(i), "j")
        assert not np.any((targets >= 1) & (targets <= 3)), i
        assert column(pt.row(i), "v").min() >= -6 and column(pt.row(i), "v").max() <= 6


def test_monotony_left_of_zero_only():
    mono = count_ptable(D=5, V=3)
    for i in mono.classes[1:]:
        entries = mono.row(i)
        left = [e.p for e in entries if e.v <= 0]
        assert all(a <= b + 2e-8 for a, b in zip(left, left[1:], strict=False)), i
    free = count_ptable(D=7, V=4, js=2, optim=4, mono=False)  # rows 4 and 5 change without it
    assert abs(free.row(4)[1].p - count_ptable(D=7, V=4, js=2, optim=4).row(4)[1].p) > 1e-3


def test_intervals_and_integer_key_bounds_tile_the_key_range():
    pt = count_ptable(D=6, V=2.5, js=2)
    lo, hi = pt.key_bounds(32)
    assert lo.dtype == hi.dtype == np.int64
    start = 0
    for i in pt.classes:
        n = len(pt.row(i))
        row_lo, row_hi = lo[start : start + n], hi[start : start + n]
        assert row_lo[0] == 0 and row_hi[-1] == 2**32
        np.testing.assert_array_equal(row_hi[:-1], row_lo[1:])
        # each entry holds p of the keys, up to the rounding of its two ends
        widths = (row_hi - row_lo) / 2**32
        np.testing.assert_allclose(widths, column(pt.row(i), "p"), atol=2**-32)
        start += n
    assert (lo[0], hi[0]) == (0, 2**32)  # i=0: a single entry v=0
    np.testing.assert_array_equal(lo, np.rint(column(pt.rows, "p_int_lb") * 2**32))
    lo8, hi8 = pt.key_bounds(8)
    assert hi8.max() == 256 and np.all(hi8 >= lo8)
    with pytest.raises(PTableError, match="bits must be between 1 and 62"):
        pt.key_bounds(64)


def test_row_lookup():
    pt = count_ptable(D=3, V=1)
    assert pt.row(3) == pt.row(4) == pt.row(10**9)
    assert pt.mean(7) == pytest.approx(0, abs=1e-7)
    with pytest.raises(PTableError, match="no row for i=-1"):
        pt.row(-1)
    nums = magnitude_ptable(D=5, V=1, step=2, icat=(1, 3, 5))
    with pytest.raises(PTableError, match=r"classes are \(0, 1, 3, 5\).*interpolate"):
        nums.row(2)


@pytest.mark.parametrize(
    "pt",
    [
        count_ptable(D=5, V=3, js=2, pstay=0.5),
        count_ptable(D=2, V=1.05, js=1, mono=(True, True, False, True)),  # pt_ex_cnts()
        magnitude_ptable(D=5, V=1, step=2, icat=(1, 5)),
        magnitude_ptable(D=3, V=1, step=3),
    ],
)
def test_round_trips_are_exact(pt):
    assert from_tauargus(to_tauargus(pt), params=pt.params) == pt
    assert from_csv(to_csv(pt), params=pt.params) == pt
    assert from_tauargus(to_tauargus(pt)).rows == pt.rows
    assert from_csv(to_csv(pt)).rows == pt.rows
    assert from_csv(to_csv(pt).replace(",", ";")).rows == pt.rows  # R's SAS export separator


def test_tauargus_text_format():
    text = to_tauargus(count_ptable(D=2, V=0.9))
    assert text.splitlines()[:3] == ["i;j;p;v;p_int_ub", "0;0;1;0;1", "1;0;0.3625;-1;0.3625"]
    assert "2;2;0.40927654;0;0.70463827" in text.splitlines()
    assert text.endswith("2;4;0.05154609;2;1\n")
    nums = to_tauargus(magnitude_ptable(D=2, V=1, step=2))
    assert nums.splitlines()[0] == "i;j;p;v;p_int_ub;type"
    assert nums.splitlines()[3].startswith("1;0.5;") and nums.splitlines()[3].endswith(";all")
    # τ-ARGUS's own file written back: the columns τ-ARGUS reads (i, j, v, p_int_ub) byte for
    # byte; p is p_int_ub - p_int_lb as in ptable 1.0 (that file's p predates it by 1e-8)
    ours, theirs = (
        [line.split(";") for line in text.splitlines()]
        for text in (to_tauargus(from_tauargus(PTAB_FREQ)), PTAB_FREQ)
    )
    assert [[f[k] for k in (0, 1, 3, 4)] for f in ours] == [
        [f[k] for k in (0, 1, 3, 4)] for f in theirs
    ]
    np.testing.assert_allclose(
        [float(f[2]) for f in ours[1:]], [float(f[2]) for f in theirs[1:]], atol=1.1e-8
    )


def test_even_and_odd_tables_and_step():
    even = magnitude_ptable(D=4, V=1, step=2, icat=(1, 4), type="even")
    odd = magnitude_ptable(D=5, V=2, step=4, icat=(1, 3, 5), optim=(4, 1, 1), type="odd")
    assert {e.type for e in even.rows} == {"even"} and {e.type for e in odd.rows} == {"odd"}
    assert set(np.round(column(even.rows, "j") * 2, 9) % 1) == {0}  # grid 1/2
    assert set(np.round(column(odd.rows, "v") * 4, 9) % 1) == {0}  # grid 1/4
    assert len(odd.row(5)) == 2 * 5 * 4 + 1  # symmetric row: -D..D by 1/step
    assert odd.variance(1) == pytest.approx(2, abs=1e-6)  # optim 4 in row 1
    text = to_tauargus(even, odd)
    assert from_tauargus(text, type="even", params=even.params) == even
    assert from_tauargus(text, type="odd", params=odd.params) == odd
    with pytest.raises(PTableError, match="holds ptables of types \\['even', 'odd'\\]"):
        from_tauargus(text)
    with pytest.raises(PTableError, match="two of types 'even' and 'odd'"):
        to_tauargus(even)
    with pytest.raises(PTableError, match="τ-ARGUS takes one count ptable"):
        to_tauargus(count_ptable(D=2, V=1), count_ptable(D=2, V=1))


def test_small_cells_ptable():
    pt = small_cells_ptable()  # pt_ex_nums(separation = TRUE)$small_cells, cellKey's label
    assert pt.type == "small_cells" and pt.classes == (0, 1, 3, 5)
    check = pt.self_check()
    assert check["var_rule"].tolist()[1:] == ["=", "<=", "<="]
    assert check["p_var"][1:].tolist() == pytest.approx([1, 1, 1], abs=1e-6)


def test_d20_generates_and_checks():
    pt = count_ptable(D=20, V=10)
    assert pt.max_i == 20 and len(pt.row(20)) == 41
    assert pt.self_check()["p_var"].iloc[-1] == pytest.approx(10, abs=1e-6)


def test_self_check_raises_on_a_biased_row():
    good = count_ptable(D=2, V=0.9)
    shifted = tuple(
        PTableRow(e.i, e.j + 1, e.p, e.v + 1, e.p_int_lb, e.p_int_ub) if e.i == 1 else e
        for e in good.rows
    )
    with pytest.raises(PTableError, match=r"i=1: mean 1 is not 0"):
        PTable(shifted, "cnts", good.params).self_check()


def test_self_check_raises_on_blocked_target_and_variance():
    good = count_ptable(D=5, V=3, js=2)
    blocked = tuple(  # move row 1's target 3 to the blocked 2
        PTableRow(1, 2, e.p, 1, e.p_int_lb, e.p_int_ub) if (e.i, e.j) == (1, 3) else e
        for e in good.rows
    )
    with pytest.raises(PTableError, match="i=1: a target in the blocked 1..js"):
        PTable(blocked, "cnts", good.params).self_check()
    rows = count_ptable(D=3, V=1).rows  # variance 1 in row 3
    with pytest.raises(PTableError, match=r"i=3: variance 1 breaks variance <= V"):
        PTable(rows, "cnts", PTableParams(D=3, V=0.5)).self_check()
    with pytest.raises(PTableError, match=r"i=3: variance 1 breaks variance = V"):
        PTable(rows, "cnts", PTableParams(D=3, V=1.5, optim=4)).self_check()


def test_malformed_tables_and_files():
    rows = count_ptable(D=2, V=0.9).rows
    with pytest.raises(PTableError, match="starts with the row for i=0"):
        PTable(rows[1:])
    with pytest.raises(PTableError, match="grouped by i in ascending order"):
        PTable(rows[:1] + rows[5:] + rows[1:5])
    with pytest.raises(PTableError, match="does not cut \\[0, 1\\)"):
        PTable(rows[:4])
    with pytest.raises(PTableError, match="need a header"):
        from_tauargus("i;j;p;v;p_int_ub\n")
    with pytest.raises(PTableError, match="malformed ptable entry"):
        from_tauargus("i;j;p;v;p_int_ub\n0;0;1;0;one\n")
    with pytest.raises(PTableError, match=r"rows \(0, 1, .*, 8\) of a 'cnts' table do not match"):
        from_tauargus(PTAB_FREQ, params=PTableParams(D=5, V=3))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(D=0, V=1), r"D \(largest noise\) must be an integer >= 1 and <= 100; got 0"),
        (dict(D=10**20, V=1), r"D \(largest noise\) must be .* <= 100; got 100000000000000000000"),
        (dict(D=2.5, V=1), r"D .* got 2.5"),
        (dict(D=3, V=-1), r"V \(noise variance\) must be a number > 0; got -1"),
        (dict(D=3, V=1, js=-2), "js must be an integer >= 0 and <= 100; got -2"),
        (dict(D=3, V=1, js=10**20), "js must be an integer >= 0 and <= 100; got 1"),
        (dict(D=3, V=1, table="nums", step=10**20), "step must be an integer >= 1 and <= 100"),
        (dict(D=3, V=1, pstay=1.5), r"pstay must lie strictly between 0 and 1 .*1.5"),
        (dict(D=3, V=1, optim=5), r"optim must be 1, 2, 3 .* or 4 .*got 5$"),
        (dict(D=3, V=1, mono=(True, False)), r"mono has 2 values but the table has 3 rows"),
        (dict(D=3, V=1, pstay=(0.5,) * 5), r"pstay has 5 values .* \(1, 2, 3\)"),
        (dict(D=2, V=5), r"V=5 is unreachable .* uniform, variance 2; .*optim=4"),
        (dict(D=20, V=1e-6), r"V=1e-06 is too small"),
        (dict(D=3, V=1, table="freq"), "table must be 'cnts' or 'nums'"),
        (dict(D=3, V=1, step=2), "step and icat apply to magnitude tables only"),
        (dict(D=3, V=1, type="even"), "count tables have type 'all'"),
        (dict(D=5, V=3, table="nums", js=2), "js and pstay do not apply to magnitude tables"),
        (dict(D=5, V=3, table="nums", icat=(1, 4)), r"icat must .* include 1 and D=5"),
        (dict(D=5, V=3, table="nums", icat=(1, 5, 10)), r"icat must hold integers in 1..D"),
        (dict(D=5, V=3, table="nums", step=10), r"D\*step must be below 50"),
        (dict(D=5, V=3, table="nums", type="both"), "type must be 'all', 'even', 'odd'"),
    ],
)
def test_bad_parameters_say_what_to_do(kwargs, message):
    with pytest.raises(PTableError, match=message) as info:
        PTableParams(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, Error)
    assert "\n" not in str(info.value)


def test_boundary_v_equal_to_the_uniform_variance_is_allowed():
    pt = count_ptable(D=2, V=2)  # uniform on -2..2 has variance exactly 2
    assert pt.variance(2) == pytest.approx(2, abs=1e-6)
    with pytest.raises(PTableError, match="unreachable"):
        PTableParams(D=2, V=2.001)
    assert PTableParams(D=2, V=2.001, optim=4).optim == (4, 4)  # variance = V can go further


def test_infeasible_row_reports_rs_message():
    # Row 1 of D=1, js=1 has only the targets 0 and 2: variance exactly 1, never below.
    with pytest.raises(
        PTableError, match=r"can't be calculated .* row i=1 .* variances 1..1; change V"
    ):
        count_ptable(D=1, V=0.5, js=1)
