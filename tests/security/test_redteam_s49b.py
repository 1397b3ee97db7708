"""Red team s49b: session 48's back-end job changes (tail coding of syntheses, linked files,
the fast path of the differencing checks, small counts' random rounding, keyed_changes, CTA).

Found (fixed): **a synthesis of fewer than 10 values shows their mean, of one its value.**
:mod:`sqlsdc.synth.tails` codes a measure's 5 largest and 5 smallest values to their means;
fewer than 10 values are all coded to their one mean. ``parametric`` then draws that value
only, and ``cart``'s smoothing leaves a value most draws hold where it is (synthpop's 70 %
rule): on the CLI demo (20,000 persons) ``SELECT sex, income FROM persons WHERE municipality
= 'R01-M008' AND age = 58`` (5 persons) stored 50 records of 182,231.944 each, their mean to
the cent, with either method; ``... AND income > 500000`` (1 person) 50 records of 706,147.09,
R01's largest income; the same 5 persons and the 2 women among them (27,178.415) gave the 3
men's total, 856,802.89, by difference. The job now refuses a coded column with 1 to 9
values (:func:`sqlsdc.synth.tails.refuse_few_values`).

Found (fixed): **a hair of noise unlinks nothing.** Two released files of the same persons
are refused when they link record by record by a column both hold exactly (s47o, s48o, s48q);
a column through ``noise`` counts as perturbed, whatever its level. ``noise:weight:c=1e-10``
moved each weight by about 1e-4: file fa (sex, age band, education, weight) beside file fb
(sex, age band, occupation, noised weight) were both released, and fb's weights rounded to
fa's 3 decimals linked 14,709 persons one to one (the tests' demo: 14,760), 301 of them among
fewer than 10 by the union of the keys, 6 unique. The job's own distance-based record
linkage rate was 98 %. ``c`` below 0.01 (0.06 % linked) is refused now
(:data:`sqlsdc.microdata.steps.LEAST_NOISE`).

Found (fixed): **a swap with near neighbours unlinks nothing either.** ``rankswap:weight:p=0.01``
(ranks closer than 2 of 20,000, allowed since s47i refused p·n/100 <= 1) counts as perturbed;
beside the exact weight, each fb record's window of 2 ranks held one fa record of its sex and
age band for 9,245 records, 9,227 of them the same person (simulated on the CLI demo with the
persons' ids: 399 among fewer than 10 by the union of the keys, 12 unique; p = 0.05: 580
linked, 292 below 10; p = 1: none). Both files were released; p below 1 is refused now
(:data:`sqlsdc.microdata.steps.LEAST_SWAP`).

Found (fixed): **a microaggregated column beside the exact one rebuilds its groups.**
Microaggregation (MDAV) of one column replaces each run of k near values by its mean; the
file counted it as perturbed (no link). ``microaggregate:weight:k=5`` in fb beside the exact
weight in fa, both released: fb's means in order with their counts are the means of
consecutive runs of fa's sorted weights, and within a run the record of fb's sex and age band
was one for 9,486 records, 8,834 of them the same person (CLI demo; k = 3: 13,863 linkable,
k = 10: 3,780, simulated). Now such a pair of files of shared rows is refused
(:func:`sqlsdc.jobs.file_pairs._refuse_rebuilt_groups`); beside weight bands it is released.

Found (fixed): **cart drew the policy's weight from donors, unsmoothed.** The job smooths and
tail-codes the columns the policy declares ``measure``; ``weight`` (role weight, as near unique:
1,521 of R01's 1,530 weights held by one person) was drawn as it is. A cart synthesis of R01's
sex, age, education, occupation and weight (weight last in the visit sequence), 5,000 records:
every weight an original one; the 4,945 held by one person showed her sex in 96 % (chance
50 %), occupation 68 % (30 %), exact age 36 % (1 %), all four 24 %, to anyone with her weight
(a released anonymised file holds it exactly). Weights are measures for cart now
(:data:`sqlsdc.synth.measures.CONFIDENTIAL_NUMBERS`).

Held (one line each; the CLI demo of 20,000 persons unless said):
- Tail coding of a large population: parametric shows the mean of R01's 5 largest incomes
  (514,340.00) exactly in about 4 of every 1,539 draws, cart its mean plus the bandwidth
  (514,927.93, the clip at max + h, 8 of 15,000 draws); with the 6th largest (342,103.31, a
  knot of the interpolated marginal, estimable only from many draws) the largest is bounded
  to [514,340, 1,203,287], no closer. Open, not fixed: two syntheses of populations one
  top earner apart give (x1 - x6)/5 exactly; x1 then needs x6 from the knot (within about
  50 from a million draws): an admin's adversarial pair, as s43c's ``person_id <> k``.
- keyed_changes: the table renamed ``PERSONS`` in the new policy with its own new ptable,
  a new ``unit_noise`` (a, b), ``mu_c``, ``sensitive_below``, ``flex.q`` after SUM(income)
  by municipality: all refused (6 tries); ``top_k: 2`` refused by validation; a new
  ``min_frequency`` (no keyed noise) applied, answers unchanged.
- Noise at c = 0.01 and 0.1, rank swapping at p = 1 and 5 beside the exact weight: DBRL
  0.06 % / 0.02 %, window links none (p = 0.5, 100 ranks: none either).
- Microaggregated weight beside weight bands (two bands at 100): released, nothing to rebuild.
- Link evasions of the exact weight in fb beside weight in fa (both under ``releases:``):
  ``weight * 2 + 1``, ``printf('%.3f', weight)``, ``DATE '2000-01-01' + CAST(weight * 1000 AS
  INTEGER)``, its ``strftime``, ``1 / weight``, ``weight + age``, ``to_hex(CAST(weight * 1000
  AS BIGINT))``: all 7 refused as linked; ``[weight]`` and ``{'w': weight}`` refused as
  nested values.
- Small counts' random rounding averaged over jobs: after a base-3 rounding of municipality x
  sex for ``age >= 85``, 8 more jobs of the same or overlapping rows (``age > 84``, ``age + 0
  >= 85``, ``NOT age < 85``, ``... AND sex IN ('F', 'M')``, ``... AND weight > 0``, ``age >=
  84``, ``age >= 83``, one municipality less) were all refused as releasing these cells
  again: no second draw of the 79 cells of 1 or 2 to average.
"""

from __future__ import annotations

import duckdb
import pytest

from sqlsdc.errors import SynthesisError


def _few(db, people: int) -> tuple[str, list[float]]:
    """A WHERE on persons holding the ``people`` largest incomes of the municipality of R01's
    largest income, and their incomes (the tester's reading)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        ((municipality,),) = con.execute(
            "SELECT municipality FROM persons WHERE region = 'R01' "
            "ORDER BY income DESC NULLS LAST LIMIT 1"
        ).fetchall()
        where = f"municipality = '{municipality}' AND income IS NOT NULL"
        ids = [i for (i,) in con.execute(
            f"SELECT person_id FROM persons WHERE {where} ORDER BY income DESC"
        ).fetchall()][:people]  # fmt: skip
        where += f" AND person_id IN ({', '.join(map(str, ids))})"
        incomes = [
            v for (v,) in con.execute(f"SELECT income FROM persons WHERE {where}").fetchall()
        ]
    finally:
        con.close()
    return where, incomes


def _shown(db, name: str) -> list[float]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [
            v for (v,) in con.execute(f"SELECT DISTINCT income FROM protected.{name}").fetchall()
        ]
    finally:
        con.close()


@pytest.mark.parametrize("method", ["parametric", "cart"])
@pytest.mark.parametrize("people", [1, 5])
def test_a_synthesis_of_fewer_than_ten_values_is_refused(fresh_demo_db, method, people):
    """Failed on main: every synthetic income was the mean of the ``people`` incomes to the
    cent (one person: her income), with both methods."""
    from sqlsdc.synth import synthesize

    where, incomes = _few(fresh_demo_db, people)
    assert len(incomes) == people
    try:
        synthesize(fresh_demo_db, user="admin", into="few", method=method, rows=50, seed=1,
                   sql=f"SELECT sex, income FROM persons WHERE {where}")  # fmt: skip
    except SynthesisError as refusal:
        assert f"income has {people} value(s)" in str(refusal)
    else:  # main: [their mean] (one person: [her income])
        mean = round(sum(incomes) / people, 3)
        assert mean not in [round(v, 3) for v in _shown(fresh_demo_db, "few")], mean
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:  # nothing stored
        assert not con.execute(
            "SELECT 1 FROM duckdb_tables() WHERE schema_name = 'protected' AND table_name = 'few'"
        ).fetchall()
    finally:
        con.close()


def test_ten_values_or_more_are_synthesised_as_coded_means(fresh_demo_db):
    """The guard's other side: 10 values are coded to the mean of the 5 smallest and of the 5
    largest, never one person's value, and stored."""
    from sqlsdc.synth import synthesize

    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        ids = [i for (i,) in con.execute(
            "SELECT person_id FROM persons WHERE region = 'R01' AND income IS NOT NULL "
            "ORDER BY person_id LIMIT 10"
        ).fetchall()]  # fmt: skip
    finally:
        con.close()
    where = f"person_id IN ({', '.join(map(str, ids))})"
    synthesize(fresh_demo_db, user="admin", into="ten", method="parametric", rows=200, seed=1,
               sql=f"SELECT sex, income FROM persons WHERE {where}")  # fmt: skip
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        incomes = sorted(v for (v,) in con.execute(
            f"SELECT income FROM persons WHERE {where}"
        ).fetchall())  # fmt: skip
    finally:
        con.close()
    low, high = sum(incomes[:5]) / 5, sum(incomes[5:]) / 5
    shown = _shown(fresh_demo_db, "ten")
    assert min(shown) == pytest.approx(low) and max(shown) == pytest.approx(high)
    assert not set(incomes) & set(shown)


def _released_beside_exact_weight(path, step: str, first: str = "weight"):
    """File fa (sex, age band, education, weight) and file fb (sex, age band, occupation,
    weight through ``step``), both under ``releases:``; fb's report."""
    from test_redteam_s48o import KEYS, release_both

    from sqlsdc.jobs.anonymize import anonymize

    band = "recode:age:breaks=30/65"
    anonymize(path, user="admin", sql=KEYS[0].format(first), into="fa", steps=[band], seed=1)
    report = anonymize(path, user="admin", sql=KEYS[1].format("weight"), into="fb",
                       steps=[band, step], seed=1)  # fmt: skip
    release_both(path)
    return report


def _pair(path):
    """fa sorted by weight, fb, and each weight's occupation in the table (the tester's)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        a = con.execute("SELECT sex, age, weight FROM protected.fa ORDER BY weight").df()
        b = con.execute("SELECT sex, age, occupation, weight FROM protected.fb").df()
        truth = dict(con.execute("SELECT weight, occupation FROM persons").fetchall())
    finally:
        con.close()
    return a, b, truth


def _linked_by_nearest(path) -> tuple[int, int]:
    """The attacker on fa and fb: records of fb whose weight, rounded as fa stores it (3
    decimals), is one record's of fa and of fb, with the same sex and age band. Scored by the
    tester: how many of them are one person (her weight, education and occupation), and how
    many of those the union of the keys (sex, age band, education, occupation) shows among
    fewer than 10 linked records."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        a, b = (con.execute(f"SELECT * FROM protected.{n}").df() for n in ("fa", "fb"))
        truth = con.execute(
            "SELECT round(weight, 3) AS w, education AS te, occupation AS to_ FROM persons "
            "QUALIFY count(*) OVER (PARTITION BY round(weight, 3)) = 1"
        ).df()
    finally:
        con.close()
    for frame in (a, b):
        frame["w"] = frame["weight"].round(3)
    a = a[a.groupby("w")["w"].transform("size") == 1]
    b = b[b.groupby("w")["w"].transform("size") == 1]
    linked = a.merge(b, on=["w", "sex", "age"])
    linked["union"] = linked.groupby(["sex", "age", "education", "occupation"])["w"].transform(
        "size"
    )
    right = linked.merge(truth, on="w")
    right = right[(right["education"] == right["te"]) & (right["occupation"] == right["to_"])]
    return len(right), int((right["union"] < 10).sum())


def test_a_hair_of_noise_does_not_unlink_two_released_files(fresh_demo_db):
    """Failed on main: ``noise:weight:c=1e-10`` moved each weight by about 1e-4, the column
    counted as perturbed (no link) and both files were released; rounded to fa's 3 decimals
    the weights linked 14,709 persons of the CLI demo one to one, 301 among fewer than 10 by
    the union of the keys. Noise below c = 0.01 is refused now."""
    from sqlsdc.errors import MicrodataError

    try:
        _released_beside_exact_weight(fresh_demo_db, "noise:weight:c=1e-10")
    except MicrodataError as refusal:
        assert "too little noise" in str(refusal)
    else:
        linked, exposed = _linked_by_nearest(fresh_demo_db)  # main: 14,760 and 324
        assert linked < 1000, (linked, exposed)


@pytest.mark.parametrize("c", ["1e-10", "1e-6", "0.009"])
def test_noise_below_the_least_level_is_refused(c):
    import numpy as np
    import pandas as pd

    from sqlsdc.errors import MicrodataError
    from sqlsdc.microdata.steps import apply_steps, parse_step

    df = pd.DataFrame({"income": np.random.default_rng(3).integers(0, 10**6, 1000) * 1.0})
    with pytest.raises(MicrodataError, match="too little noise"):
        apply_steps(df, [parse_step(f"noise:income:c={c}")], secret=b"s" * 32, seed=0)


def test_noise_at_the_least_level_links_nearly_nothing(fresh_demo_db):
    """The other side: c = 0.01 is stored and released beside the exact weight; the job's
    distance-based record linkage finds under 0.5 % of the records (c = 1e-10: 98 %)."""
    report = _released_beside_exact_weight(fresh_demo_db, "noise:weight:c=0.01")
    assert report.linkage["euclidean"] < 0.005, report.linkage


def _linked_by_rank_window(path, window: int) -> int:
    """The attacker on fa (exact weight) and fb (weight rank-swapped within ``window`` ranks):
    each record of fb whose window of fa's weights holds one record of its sex and age band
    is linked to it. Scored: how many links are right by the person holding that weight (her
    occupation is fb's record's; a wrong link agrees about one time in ten)."""
    import numpy as np

    a, b, truth = _pair(path)
    weights, keys = a["weight"].to_numpy(), (a["sex"] + a["age"]).to_numpy()
    at = np.searchsorted(weights, b["weight"].to_numpy())
    low = weights[np.clip(at - window, 0, len(a) - 1)]
    high = weights[np.clip(at + window, 0, len(a) - 1)]
    right = 0
    for i, key in enumerate((b["sex"] + b["age"]).to_numpy()):
        first = np.searchsorted(weights, low[i], side="left")
        last = np.searchsorted(weights, high[i], side="right")
        found = np.flatnonzero(keys[first:last] == key)
        if len(found) == 1:
            right += truth.get(weights[first + found[0]]) == b["occupation"].iat[i]
    return int(right)


def test_a_swap_with_near_neighbours_does_not_unlink_two_released_files(fresh_demo_db):
    """Failed on main: ``rankswap:weight:p=0.01`` (2 ranks of 20,000) counted as perturbed and
    both files were released; the attacker's window links gave 9,227 persons of the CLI demo
    (simulated with the persons' ids: 399 of them among fewer than 10 by the union of the
    keys, 12 unique). p below 1 is refused now."""
    from sqlsdc.errors import MicrodataError

    try:
        _released_beside_exact_weight(fresh_demo_db, "rankswap:weight:p=0.01")
    except MicrodataError as refusal:
        assert "near neighbour" in str(refusal)
    else:
        right = _linked_by_rank_window(fresh_demo_db, 2)
        assert right < 1000, right


def test_a_swap_at_the_least_p_links_nothing_by_its_window(fresh_demo_db):
    """The other side: p = 1 (200 ranks) is stored and released beside the exact weight; the
    window attack links no more than chance agrees with."""
    _released_beside_exact_weight(fresh_demo_db, "rankswap:weight:p=1")
    assert _linked_by_rank_window(fresh_demo_db, 200) < 100


def _linked_by_rebuilt_groups(path) -> int:
    """The attacker on fa (exact weight) and fb (weight microaggregated): fb's group means in
    order, each held by k records, are the means of consecutive runs of k of fa's sorted
    weights; each fb record whose run holds one fa record of its sex and age band is linked
    to it. Scored as :func:`_linked_by_rank_window`."""
    import numpy as np

    a, b, truth = _pair(path)
    weights, keys = a["weight"].to_numpy(), (a["sex"] + a["age"]).to_numpy()
    runs, start = {}, 0
    for mean, k in b["weight"].value_counts().sort_index().items():
        runs[mean], start = (start, start + k), start + k
    right = 0
    rows = zip(b["weight"], b["sex"] + b["age"], b["occupation"], strict=True)
    for mean, key, occupation in rows:
        first, last = runs[mean]
        found = np.flatnonzero(keys[first:last] == key)
        if len(found) == 1:
            right += truth.get(weights[first + found[0]]) == occupation
    return int(right)


def test_a_microaggregated_weight_beside_the_exact_one_is_not_released(fresh_demo_db):
    """Failed on main: ``microaggregate:weight:k=5`` counted as perturbed, no link, both files
    released; rebuilding fb's groups from fa's exact weights linked 8,834 persons of the CLI
    demo one to one (the tests' demo: over 8,000). Refused now."""
    from sqlsdc.errors import PolicyError

    try:
        _released_beside_exact_weight(fresh_demo_db, "microaggregate:weight:k=5")
    except PolicyError as refusal:
        assert "microaggregated" in str(refusal)
    else:
        right = _linked_by_rebuilt_groups(fresh_demo_db)
        assert right < 1000, right


def test_a_microaggregated_weight_beside_banded_weights_is_released(fresh_demo_db):
    """The other side: the same file beside one with the weight in two bands is released."""
    bands = "CASE WHEN weight < 100 THEN 'a' ELSE 'b' END"
    _released_beside_exact_weight(fresh_demo_db, "microaggregate:weight:k=5", first=bands)


def test_cart_does_not_draw_a_persons_exact_weight(fresh_demo_db):
    """Failed on main: the policy's ``weight`` (role weight, not measure) was neither smoothed
    nor tail-coded, so every synthetic weight was a donor's: of 5,000 records of R01's sex,
    age, education, occupation and weight (CLI demo), the 4,945 whose weight one person holds
    showed her sex in 96 % (chance 50 %), her occupation in 68 % (30 %), her exact age in 36 %
    (1 %). Weights are smoothed as measures are now: few synthetic weights are a person's."""
    from sqlsdc.synth import synthesize

    sql = "SELECT sex, age, education, occupation, weight FROM persons WHERE region = 'R01'"
    synthesize(fresh_demo_db, user="admin", into="cw", method="cart", sql=sql, rows=2000, seed=3)
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        ((shown, agree),) = con.execute(
            "WITH p AS (SELECT weight, any_value(age) AS age FROM persons WHERE region = 'R01' "
            "GROUP BY weight HAVING count(*) = 1) "
            "SELECT count(*), count(*) FILTER (WHERE s.age = p.age) FROM protected.cw s "
            "JOIN p USING (weight)"
        ).fetchall()
    finally:
        con.close()
    assert shown < 100 and agree < 20, (shown, agree)  # main: about 1,980 and 700
