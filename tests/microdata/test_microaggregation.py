"""Microaggregation on the digests' worked cases, on the CASC reference files, and by property."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata.microaggregation import (
    groups,
    il1s,
    improve,
    information_loss,
    mdav,
    microaggregate,
    sse,
    sst,
    standardise,
    vmdav,
)

DATA = Path("/work/shared/data")


def _partition(x, labels):
    return sorted(sorted(float(v) for v in np.asarray(x).ravel()[g]) for g in groups(labels))


def test_mdav_worked_case_t8():
    """Digest 2006 T8: groups {20,21,22}, {1,2,3}, {10,11,12}; SSE 6, SST 548, L 1.0949%."""
    x = np.array([1.0, 2, 3, 10, 11, 12, 20, 21, 22])[:, None]
    labels = mdav(x, 3)
    assert _partition(x, labels) == [[1, 2, 3], [10, 11, 12], [20, 21, 22]]
    assert labels[6] == 0  # the first group is around 20, the record farthest from the centroid
    assert sse(x, labels) == pytest.approx(6.0)
    assert sst(x) == pytest.approx(548.0)
    assert information_loss(x, labels, standardise=False) == pytest.approx(100 * 6 / 548)
    assert x.var() - x[:, 0][labels].var() != 0  # sanity: labels index rows
    masked = np.array([x[labels == g].mean() for g in labels])
    assert x.var() - masked.var() == pytest.approx(6 / 9)  # variance drops by SSE/N


def test_hansen_mukherjee_case_t2_2022():
    """Digest 2022 T2: the optimum is SSE 9 (IL 0.6764%); MDAV reaches it, nothing goes below."""
    x = np.array([1.0, 2, 3, 10, 11, 12, 13, 30, 31, 32])[:, None]
    for labels in (mdav(x, 3), improve(x, 3)):
        assert sse(x, labels) == pytest.approx(9.0)
        assert information_loss(x, labels, standardise=False) == pytest.approx(0.6764, abs=1e-4)


def test_optimiser_finds_the_2_microaggregation_optimum_t9():
    """Digest 2006 T9: x = (0, 1, 10, 11, 12), k = 2: optimum {0,1}, {10,11,12}, SSE 2.5."""
    x = np.array([0.0, 1, 10, 11, 12])[:, None]
    labels = improve(x, 2)
    assert _partition(x, labels) == [[0, 1], [10, 11, 12]]
    assert sse(x, labels) == pytest.approx(2.5)


def test_sse_equals_the_pairwise_identity_eq4():
    """Castro et al. 2022, eq. 4: SSE_h = (1/(2 n_h)) Σ_i Σ_j ‖a_i − a_j‖² (digest 2022 T1)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 3))
    one = np.zeros(7, dtype=np.int64)
    pairwise = ((a[:, None, :] - a[None, :, :]) ** 2).sum() / (2 * 7)
    assert sse(a, one) == pytest.approx(pairwise, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 70),
    d=st.integers(1, 4),
    k=st.integers(2, 6),
    seed=st.integers(0, 10**6),
    ties=st.booleans(),
)
def test_every_group_has_k_to_2k_minus_1_records(n, d, k, seed, ties):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, (n, d)).astype(float) if ties else rng.standard_normal((n, d))
    if n < k:
        with pytest.raises(MicrodataError, match="cannot form a group"):
            mdav(x, k)
        return
    base = mdav(x, k)
    better = improve(x, k, rounds=3)
    for labels in (base, better):
        sizes = np.bincount(labels)
        assert sizes.min() >= k and (n < 2 * k or sizes.max() <= 2 * k - 1)
        assert len(labels) == n
    variable = vmdav(x, k, gamma=1.1)
    assert np.bincount(variable).min() >= k and len(variable) == n
    assert sse(x, better) <= sse(x, base) + 1e-9


def test_mdav_and_optimiser_on_the_casc_files():
    """sdcMicro's MDAV figures (issue 20) and the optimiser targets of Castro et al. 2022."""
    if not DATA.is_dir():
        pytest.skip("the CASC reference files are not on this machine")
    cases = {
        "casc_census": {3: (5.69, 5.25), 10: (14.16, 12.36)},
        "tarragona": {5: (22.46, 20.74)},
    }
    for name, targets in cases.items():
        x = standardise(pd.read_csv(DATA / f"{name}.csv").to_numpy(float))
        for k, (mdav_il, target) in targets.items():
            assert information_loss(x, mdav(x, k)) == pytest.approx(mdav_il, abs=0.005)
            labels = improve(x, k, rounds=40)
            assert information_loss(x, labels) <= target
            assert np.bincount(labels).min() >= k


def test_optimiser_is_deterministic():
    x = np.random.default_rng(5).standard_normal((200, 3))
    assert (improve(x, 3, rounds=10, seed=1) == improve(x, 3, rounds=10, seed=1)).all()


def test_microaggregate_replaces_columns_by_group_means():
    df = pd.DataFrame(
        {"a": [1.0, 2, 3, 10, 11, 12, 20, 21, 22], "b": list(range(9)), "id": list("abcdefghi")}
    )
    out = microaggregate(df, ["a", "b"], 3)
    assert list(out.data["id"]) == list(df["id"])
    assert sorted(set(out.data["a"])) == [2.0, 11.0, 21.0]
    assert out.data.groupby(["a", "b"]).size().min() >= 3
    assert out.il == pytest.approx(information_loss(df[["a", "b"]].to_numpy(float), out.labels))
    assert out.il1s == pytest.approx(il1s(df[["a", "b"]], out.data[["a", "b"]]))
    assert microaggregate(df, ["a"], 3, method="optimal").il <= out.il + 1e-9


def test_il1s_formula():
    x = np.array([[0.0], [2.0]])  # S = √2
    z = np.array([[1.0], [1.0]])
    assert il1s(x, z) == pytest.approx(1 / (np.sqrt(2) * np.sqrt(2)))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"columns": ["nope"], "k": 3}, "not in the data"),
        ({"columns": ["a"], "k": 1}, "k must be an integer"),
        ({"columns": ["a"], "k": 3, "method": "kmeans"}, "unknown microaggregation method"),
        ({"columns": ["s"], "k": 2}, "numeric columns"),
        ({"columns": ["m"], "k": 3}, "cannot form a group"),
    ],
)
def test_microaggregate_rejects_bad_input(kwargs, match):
    df = pd.DataFrame({"a": [1.0, 2, 3], "s": list("xyz"), "m": [1.0, None, 2]})
    with pytest.raises(MicrodataError, match=match):
        microaggregate(df, **kwargs)


def test_rows_with_missing_values_are_left_out():
    df = pd.DataFrame({"a": [1.0, 2, None, 3, 10, 11, 12], "b": [1.0, 1, 1, 1, 2, 2, np.nan]})
    out = microaggregate(df, ["a", "b"], 2)
    assert out.labels[2] == -1 and out.labels[6] == -1
    assert np.isnan(out.data["a"][2]) and out.data["a"][6] == 12 and np.isnan(out.data["b"][6])
    assert (np.bincount(out.labels[out.labels >= 0]) >= 2).all()


def test_partitioned_mdav_keeps_groups_and_most_of_the_quality():
    x = standardise(np.random.default_rng(8).standard_normal((6000, 4)))
    whole, parts = mdav(x, 3), mdav(x, 3, block=1000)
    sizes = np.bincount(parts)
    assert sizes.min() >= 3 and sizes.max() <= 5 and len(parts) == 6000
    assert information_loss(x, parts) < 1.1 * information_loss(x, whole)
    assert (mdav(x, 3, block=10_000) == whole).all()  # one slice: plain MDAV
    with pytest.raises(MicrodataError, match="at least 2k"):
        mdav(x, 3, block=5)


def test_vmdav_worked_case_and_castro_baselines():
    """V-MDAV on T8, and Castro et al. 2022's Step-2 figures (digest 2022 §1.2, T4)."""
    x = np.array([1.0, 2, 3, 10, 11, 12, 20, 21, 22])[:, None]
    assert _partition(x, vmdav(x, 3)) == [[1, 2, 3], [10, 11, 12], [20, 21, 22]]
    if not DATA.is_dir():
        pytest.skip("the CASC reference files are not on this machine")
    tarragona = standardise(pd.read_csv(DATA / "tarragona.csv").to_numpy(float))
    assert information_loss(tarragona, vmdav(tarragona, 3, gamma=0.7)) == pytest.approx(
        15.85, abs=0.005
    )
    census = standardise(pd.read_csv(DATA / "casc_census.csv").to_numpy(float))
    for k, il in ((3, 5.66), (5, 8.98), (10, 14.04)):
        assert information_loss(census, vmdav(census, k)) == pytest.approx(il, abs=0.11)


def test_mdav_in_parts_gives_the_labels_of_one_pass_and_leaves_its_input():
    """MDAV runs in calls of about ``work`` record visits (so that a signal can stop it):
    the labels are the same for any ``work``, and the caller's records stay in place, one
    variable included (NumPy's ``ascontiguousarray(X.T)`` of n × 1 is X itself)."""
    from sqlsdc.microdata import _kernels

    rng = np.random.default_rng(5)
    for n, d, k in [(11, 1, 5), (1001, 1, 3), (2003, 3, 4)]:
        X = np.ascontiguousarray(rng.normal(size=(n, d)).round(1))
        before = X.copy()
        whole = _kernels.mdav(X, k, 1 << 62)
        assert np.array_equal(X, before)
        for work in (1, 97, 10_000):
            assert np.array_equal(_kernels.mdav(X, k, work), whole)
        assert sorted(np.bincount(whole))[0] >= k


def test_ctrl_c_stops_a_long_mdav(tmp_path):
    """SIGINT stopped a long MDAV only when it ended: `sqlsdc anonymize --step
    microaggregate` on the demo's million persons ran on for minutes after Ctrl-C and SIGTERM
    (new user s47f). MDAV of 200,000 records takes minutes; SIGINT stops it within seconds."""
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import numpy as np\n"
        "from sqlsdc.microdata import _kernels\n"
        "_kernels.mdav(np.zeros((30, 2)), 3)\n"  # compiled (or loaded) before the clock
        "X = np.random.default_rng(1).normal(size=(200_000, 2))\n"
        "print('started', flush=True)\n"
        "_kernels.mdav(X, 3)\n"
        "print('finished', flush=True)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout.readline().strip() == "started"
        time.sleep(1.0)
        process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _out, err = process.communicate(timeout=20)
        assert time.monotonic() - sent < 5, "MDAV ran on after SIGINT"
        assert "KeyboardInterrupt" in err
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
