"""Red team s47i: the microdata and synthetic-data jobs' outputs, read as an analyst would.

The attacker reads an anonymised or synthetic file the admin stored (and may publish) and knows
public facts about a target person (region, sex, age, education: what a neighbour knows).

Every attack tried, one line each (W: worked, fixed here; O: worked, left open; H: held):

- W  local suppression to k-anonymity counted a blank as matching any value (sdcMicro's
     ``alpha = 1``) and stopped there; an intruder who knows a person's key finds her among the
     records showing that key or a blank where it differs, and only rare keys were blanked.
     The README's example (R01's 23,296 persons aged 65-89, municipality, sex, age, education,
     k = 3, 1,000,000-person demo): 4 persons alone among the records their key allows, 8
     among two, while the risk report said "records with fk < 3: 0". The tests' demo (keys
     region, sex, age in 6 bands, education): at k = 3, 4 persons among 2 records; at k = 10,
     119 persons among 5 to 9. Now a record is safe only when k records show exactly its key,
     blanks included (``alpha = 0``); the last all-blank records get company. Cost on the
     20,000-person CLI demo: k = 3 blanks 24 values instead of 6, k = 10 412 instead of 220;
     municipality, sex, age, education at k = 3: 5,738 instead of 4,728; the README example
     125 instead of 103.
- W  ``rankswap:income:p=0.001`` over 20,000 records: a window of 0.2 ranks, no value swapped,
     every income stored as it was while the file called it perturbed (s39c's ``noise c=0``
     through another step). Refused now when p·n/100 <= 1.
- W  ``noise:income:c=1`` over the two persons of municipality R01-M013 (``--sql``): add_noise
     returns fewer than d + 2 records as they are (shuffle: fewer than 3), and both incomes
     were stored exactly, as noised. Refused now, naming the step and the count.
- W  ``anonymize --help``'s own example (``--from persons``, keys region, sex, age,
     education, k = 3): the report said "records with fk < 3: 0" while the file showed
     municipality, and 1,466 of the 20,000 persons were unique by municipality, sex, age band
     and education (5,989 with occupation too). Keys that name a level of a policy hierarchy
     must now name the finest level the file shows (``jobs/risk_keys.py``); the example reads
     the persons without geography. Keys that leave out other columns (occupation) stay
     the admin's choice.
- W  ``synthesize --method cart`` without smoothing (the default then): every synthetic income
     was an original one (100 % on R01's 1,539 persons, 1,500 records); of the 203 persons
     unique by sex, age, education and occupation whose key shows a single synthetic income,
     27 saw their own to the cent (13 %); with ``--option smoothing=density`` 1. Fixed in
     s47m: the job smooths every policy measure by default, warns when told not to, and
     refuses a measure it cannot smooth.
- O  ``synthesize --method parametric --rows`` 100 times the source: the largest synthetic
     income of R01 was 706,123.30 for a largest original of 706,147.09 (0.003 %; the tests'
     demo: 591,212 for 591,601); cart smoothed, 706,263. One copy of 1,500 records: 629,263
     (between the two largest). The README says to top-code first. Strict xfail below.
- O  totals of perturbed measures are exact (microaggregation's group means, exact-moment
     noise's zero mean, shuffling and rank swapping permute the values), but a file's exact
     release lists unperturbed columns only (``Release.held``): a difference of 10 or more
     units dominated by one, between a file's total and an exact sum job, is not judged by
     p % or nk. Closed in s48c (test_redteam_s48c.py): a file of R02's firms, turnover
     microaggregated, less a job of R02 without activity I (10+ firms) gave I's total.
- O  no job refuses on its own risk measure: a file with no step on its keys is stored with its
     sample uniques as they were (listing it under ``releases:`` is the admin's choice).
- H  two files of R01 (one without municipality R01-M015, 1 person), income microaggregated
     k = 5: their income totals differ by that person's income to the cent (9,133.96), but a
     policy listing both is refused (s42c, drawn columns); 1 job + 2 files, 3 queries.
- H  a suppression job SUM(income) of R01 by sex, then the file without R01-M015: refused
     (populations 1 unit apart).
- H  two suppress-only files of every person (k = 5, opposite importance orders), linkable by
     their exact incomes to undo each other's blanks: listing both refused (blanked cells).
- H  microaggregate k = 1 (refused, k >= 2); PRAM ``invariant`` spelt 00, -0, +1 (the estimate
     refuses wherever the step was invariant); the invariant matrix is in no release.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import MicrodataError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.microdata import perturb
from sqlsdc.microdata.steps import apply_steps, parse_step

KEYS = ["region", "sex", "age", "education"]
WITHOUT_MUNICIPALITY = "SELECT region, sex, age, education, occupation, income, weight FROM persons"


def _candidates(file: pd.DataFrame, originals: pd.DataFrame, keys: list[str]) -> np.ndarray:
    """Per original record: the records of the file an intruder who knows its key cannot rule
    out (each key shown equal or blank)."""
    shown = file[keys].astype("string")
    known = originals[keys].astype("string")
    combos, inverse = np.unique(known.to_numpy(str), axis=0, return_inverse=True)
    out = np.empty(len(combos), dtype=np.int64)
    for i, combo in enumerate(combos):
        match = np.ones(len(shown), dtype=bool)
        for column, value in zip(keys, combo, strict=True):
            match &= (shown[column].isna() | (shown[column] == value)).to_numpy()
        out[i] = match.sum()
    return out[inverse.ravel()]


def test_a_lone_blank_is_not_hidden_by_the_records_it_matches():
    # (A, F) is rare: its sex is blanked, and (A, blank) "matches" the three (A, M), so
    # sdcMicro's count says 4; who knows she is a woman of A finds one record: hers
    df = pd.DataFrame({"region": list("AAAABBBBBB"), "sex": list("FMMMFFFMMM")})
    out, counts = perturb.local_suppression(df, ["region", "sex"], 3, [1, 2])
    assert _candidates(out, df, ["region", "sex"]).min() >= 3
    assert perturb._blank_group_sizes(out, ["region", "sex"]).min() >= 3
    assert sum(counts.values()) == int(out.isna().sum().sum())


@pytest.mark.parametrize("seed", range(6))
def test_every_record_shares_its_shown_key_with_k_records(seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "region": rng.choice(list("ABCDEFG"), 300),
            "sex": rng.choice(list("FM"), 300),
            "age": rng.integers(0, 9, 300),
        }
    )
    for k in (2, 3, 5):
        out, _ = perturb.local_suppression(df, ["region", "sex", "age"], k, [1, 2, 3])
        assert perturb._blank_group_sizes(out, ["region", "sex", "age"]).min() >= k
        assert _candidates(out, df, ["region", "sex", "age"]).min() >= k


@pytest.mark.parametrize("k", [3, 10])
def test_a_neighbour_finds_k_records_for_every_person_of_the_file(fresh_demo_db, k):
    """The job on the demo (fails on main: at k = 3 persons among 2 records, at k = 10 among 2
    to 9, with the report's "records with fk < k" at 0)."""
    steps = ["recode:age:breaks=15/30/45/65/85", f"suppress:{','.join(KEYS)}:k={k}"]
    report = anonymize(fresh_demo_db, user="admin", sql=WITHOUT_MUNICIPALITY, into=f"p{k}",
                       steps=steps, keys=KEYS, seed=1)  # fmt: skip
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        file = con.sql(f"SELECT {', '.join(KEYS)} FROM protected.p{k}").df()
        originals = con.sql(f"SELECT {', '.join(KEYS)} FROM persons").df()
    finally:
        con.close()
    originals["age"] = perturb.recode(originals["age"], [15, 30, 45, 65, 85])
    candidates = _candidates(file, originals, KEYS)
    assert file[KEYS].isna().any(axis=1).sum() > 0  # something was blanked
    assert candidates.min() >= k, (int((candidates < k).sum()), int(candidates.min()))
    assert report.records == len(originals)


@pytest.mark.parametrize("p", ["0.001", "0.005"])
def test_a_rank_swap_that_swaps_nothing_is_refused(p):
    """Fails on main: ``rankswap:income:p=0.001`` over 20,000 records left every value as it
    was (a window of 0.2 ranks), and the file would hold the incomes exactly as perturbed."""
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"income": rng.integers(0, 10**6, 20_000).astype(float)})
    with pytest.raises(MicrodataError, match="swaps nothing"):
        apply_steps(df, [parse_step(f"rankswap:income:p={p}")], secret=b"s" * 32, seed=0)
    out, _ = apply_steps(df, [parse_step("rankswap:income:p=1")], secret=b"s" * 32, seed=0)
    assert (out["income"] != df["income"]).mean() > 0.9


@pytest.mark.parametrize(
    ("step", "records"),
    [("noise:income:c=1", 2), ("noise:income,age:c=1", 3), ("shuffle:income", 2)],
)
def test_a_step_that_returns_too_few_records_as_they_are_is_refused(step, records):
    """Fails on main: ``noise:income:c=1`` over the two persons of a municipality (add_noise
    needs d + 2 records, shuffle 3) stored both incomes as they were, as perturbed."""
    df = pd.DataFrame(
        {"income": [47104.6, 127383.16, 9133.96][:records], "age": [30, 40, 50][:records]}
    )
    with pytest.raises(MicrodataError, match="changes nothing"):
        apply_steps(df, [parse_step(step)], secret=b"s" * 32, seed=0)
    more = pd.DataFrame({"income": np.arange(1.0, 9.0), "age": np.arange(20.0, 28.0)})
    out, _ = apply_steps(more, [parse_step(step)], secret=b"s" * 32, seed=0)
    assert (out["income"] != more["income"]).any()


def test_keys_coarser_than_the_file_are_refused(fresh_demo_db):
    """Fails on main: ``anonymize --help``'s example (keys region, sex, age, education at k = 3,
    the file showing municipality) was stored with "records with fk < 3: 0" while 1,466 of
    the 20,000 persons were unique on municipality, sex, age band and education."""
    steps = ["recode:age:breaks=15/30/45/65/85", f"suppress:{','.join(KEYS)}:k=3"]
    with pytest.raises(MicrodataError, match="shows municipality, a finer level of it"):
        anonymize(fresh_demo_db, user="admin", source="persons", into="coarse", steps=steps,
                  keys=KEYS, seed=1)  # fmt: skip
    con = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        stored = con.sql("SELECT count(*) FROM information_schema.tables WHERE table_name = "
                         "'coarse'").fetchall()  # fmt: skip
        decision = con.sql("SELECT decision FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1")
        decision = decision.fetchall()
    finally:
        con.close()
    assert stored == [(0,)] and decision == [("refused",)]
    fine = ["municipality", "sex", "age", "education"]
    steps = [steps[0], f"suppress:{','.join(fine)}:k=3"]
    report = anonymize(fresh_demo_db, user="admin", source="persons", into="fine",
                       steps=steps, keys=fine, seed=1)  # fmt: skip
    assert report.after["violations"]["3"] == 0


def _cart_income_hits(db, name: str) -> tuple[int, int]:
    """Persons of R01 unique by sex, age, education and occupation whose key shows one income
    in the synthetic file: how many, and how many of those show the person's own income."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        key = "sex, age, education, occupation"
        original = con.sql(f"SELECT {key}, income FROM persons WHERE region = 'R01'").df()
        synthetic = con.sql(f"SELECT {key}, income FROM protected.{name}").df()
    finally:
        con.close()
    columns = ["sex", "age", "education", "occupation"]
    unique = original.groupby(columns).filter(lambda g: len(g) == 1)
    shown = synthetic.groupby(columns)["income"].agg(["nunique", "first"])
    joined = unique.join(shown, on=columns, how="inner")
    single = joined[joined["nunique"] == 1]
    return len(single), int((single["first"] - single["income"]).abs().lt(0.005).sum())


def test_cart_smooths_measures_so_unique_persons_do_not_see_their_income(fresh_demo_db):
    """Failed on int47 (strict xfail): cart without smoothing (the job's default then) drew each
    income from an original donor of its leaf; of the 203 persons of R01 (CLI demo) unique by
    sex, age, education and occupation whose key shows one synthetic income, 27 saw their own
    to the cent (the tests' demo: 33 of 225). The job now smooths every measure by default."""
    from sqlsdc.synth import synthesize

    sql = "SELECT sex, age, education, occupation, income FROM persons WHERE region = 'R01'"
    synthesize(fresh_demo_db, user="admin", into="syn", method="cart", sql=sql, rows=1500, seed=3)
    single, own = _cart_income_hits(fresh_demo_db, "syn")
    assert single > 50 and own <= max(2, single // 100), (single, own)


def test_many_synthetic_rows_do_not_tell_the_largest_income(fresh_demo_db):
    """Failed on main (strict xfail, s47i): parametric mapped normal scores through the
    empirical quantile function of the raw values, so the largest of m draws landed at 1 - 1/m
    of the top gap (--rows 153,900 over R01's 1,539 persons, CLI demo: 706,123.30 for a largest
    income of 706,147.09, 0.003 %). The marginal is now top- and bottom-coded: its 5 largest
    values replaced by their mean (Hundepool et al. 2012, §3.4)."""
    shown, largest = _largest_of_many_rows(fresh_demo_db, "parametric")
    assert abs(shown - largest) > 0.01 * largest, (shown, largest)


def test_many_cart_rows_do_not_tell_the_largest_income(fresh_demo_db):
    """Failed on main: cart drew donors' incomes and smoothed them within [min, max + h], so
    100 times R01's rows put the largest draw at the largest income plus about h (CLI demo:
    706,263 for 706,147, 0.02 %). The job now codes a measure's 5 largest values to their mean
    before cart is fitted (:mod:`sqlsdc.synth.tails`)."""
    shown, largest = _largest_of_many_rows(fresh_demo_db, "cart")
    assert abs(shown - largest) > 0.01 * largest, (shown, largest)


def _largest_of_many_rows(db, method: str) -> tuple[float, float]:
    """The largest income of a synthesis of 100 times R01's rows, and the original's."""
    from sqlsdc.synth import synthesize

    sql = "SELECT sex, age, education, income FROM persons WHERE region = 'R01'"
    con = duckdb.connect(str(db), read_only=True)
    try:
        ((n, largest),) = con.sql(f"SELECT count(*), max(income) FROM ({sql})").fetchall()
    finally:
        con.close()
    synthesize(db, user="admin", into="many", method=method, sql=sql, rows=100 * n, seed=3)
    con = duckdb.connect(str(db), read_only=True)
    try:
        ((shown,),) = con.sql("SELECT max(income) FROM protected.many").fetchall()
    finally:
        con.close()
    return float(shown), float(largest)
