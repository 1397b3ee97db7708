"""The reproducible synthetic population of the demo database (docs/ARCHITECTURE.md).

Municipality sizes are log-normal (σ = 1.8) inside eight regions, so large cities sit next to
villages of a handful of people and small cells appear as soon as a table is crossed by age or sex.
Incomes are log-normal with a long tail; enterprise turnover is Pareto-distributed so that one or
two enterprises dominate many cells. The same seed always gives the same data.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from sqlsdc.engines.duckdb import EngineError

REGIONS = {
    "R01": "Northcoast",
    "R02": "Eastvale",
    "R03": "Southmoor",
    "R04": "Westfield",
    "R05": "Highlands",
    "R06": "Lakeside",
    "R07": "Riverdale",
    "R08": "Capital",
}
MUNICIPALITIES_PER_REGION = 25
EDUCATION = ["primary", "lower_secondary", "upper_secondary", "tertiary"]
OCCUPATIONS = [
    "managers",
    "professionals",
    "technicians",
    "clerks",
    "service_sales",
    "agriculture",
    "craft_trades",
    "operators",
    "elementary",
    "armed_forces",
    "not_employed",
]
OCCUPATION_P = [0.05, 0.15, 0.12, 0.08, 0.14, 0.03, 0.09, 0.06, 0.08, 0.002, 0.198]
TENURE, TENURE_P = ["owner", "tenant", "social"], [0.6, 0.3, 0.1]
SCHEMES, SCHEME_P = ["child", "housing", "unemployment", "disability"], [0.4, 0.3, 0.2, 0.1]
NACE = list("ABCDEFGHIJKLMNPQRS")
SIZE_CLASSES = ["micro", "small", "medium", "large"]

Progress = Callable[[str, int], None]


def municipalities() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, region codes and log-normal population shares of all municipalities."""
    codes, regions = [], []
    for region in REGIONS:
        for j in range(1, MUNICIPALITIES_PER_REGION + 1):
            codes.append(f"{region}-M{j:03d}")
            regions.append(region)
    rng = np.random.default_rng(0)  # fixed layout: which municipality is big never changes
    share = np.exp(rng.normal(0.0, 1.8, len(codes)))
    return np.array(codes), np.array(regions), share / share.sum()


def build_tables(persons: int, seed: int, progress: Progress | None = None) -> dict[str, pa.Table]:
    """Generate the five demo tables as Arrow tables."""
    if persons < 1:
        raise ValueError("the demo needs at least one person")
    step = progress or (lambda _label, _n: None)
    rng = np.random.default_rng(seed)
    muni, muni_region, share = municipalities()

    sizes = np.clip(1 + rng.poisson(1.3, persons), 1, 10)  # more than enough households
    cumulative = np.cumsum(sizes)
    n_households = int(np.searchsorted(cumulative, persons) + 1)
    sizes = sizes[:n_households]
    sizes[-1] -= int(cumulative[n_households - 1] - persons)
    hh_muni = rng.choice(len(muni), size=n_households, p=share)
    households = pa.table(
        {
            "household_id": np.arange(1, n_households + 1, dtype=np.int64),
            "region": muni_region[hh_muni],
            "municipality": muni[hh_muni],
            "size": sizes.astype(np.int32),
            "tenure": rng.choice(TENURE, size=n_households, p=TENURE_P),
        }
    )
    step("households", n_households)

    hh_of_person = np.repeat(np.arange(n_households), sizes)
    first_member = np.r_[True, hh_of_person[1:] != hh_of_person[:-1]]
    age = np.where(first_member, rng.integers(18, 95, persons), rng.integers(0, 95, persons))
    edu_level = np.clip((rng.normal(1.6, 1.0, persons) + (age > 22) * 0.6).round(), 0, 3)
    edu_level = np.where(age < 12, 0, np.where(age < 16, np.minimum(edu_level, 1), edu_level))
    occupation = rng.choice(OCCUPATIONS, size=persons, p=OCCUPATION_P)
    occupation = np.where((age < 16) | (age > 70), "not_employed", occupation)
    income = np.exp(rng.normal(10.2 + 0.25 * edu_level, 0.75, persons)).round(2)
    income = np.where(age < 16, 0.0, income)
    income_missing = rng.random(persons) < 0.02
    persons_table = pa.table(
        {
            "person_id": np.arange(1, persons + 1, dtype=np.int64),
            "household_id": (hh_of_person + 1).astype(np.int64),
            "region": muni_region[hh_muni][hh_of_person],
            "municipality": muni[hh_muni][hh_of_person],
            "sex": rng.choice(["F", "M"], size=persons),
            "age": age.astype(np.int32),
            "education": np.array(EDUCATION)[edu_level.astype(int)],
            "occupation": occupation,
            "income": pa.array(income, mask=income_missing),
            "weight": rng.uniform(50, 150, persons).round(3),
        }
    )
    step("persons", persons)

    n_enterprises = max(1, persons // 20)
    employees = np.minimum((rng.pareto(1.1, n_enterprises) * 3).astype(np.int64) + 1, 100_000)
    turnover = (employees * np.exp(rng.normal(11.5, 1.0, n_enterprises))).round(0)
    n_holdings = max(1, n_enterprises // 50)
    in_group = rng.random(n_enterprises) < 0.2
    ent_ids = np.arange(1, n_enterprises + 1, dtype=np.int64)
    holding = np.where(
        in_group, 1_000_000 + rng.integers(1, n_holdings + 1, n_enterprises), ent_ids
    )
    size_class = np.array(SIZE_CLASSES)[np.searchsorted([10, 50, 250], employees, side="right")]
    nace_p = np.linspace(3, 1, len(NACE))
    enterprises = pa.table(
        {
            "enterprise_id": ent_ids,
            "holding_id": holding.astype(np.int64),
            "nace": rng.choice(NACE, size=n_enterprises, p=nace_p / nace_p.sum()),
            "region": rng.choice(
                list(REGIONS), size=n_enterprises, p=_region_shares(muni_region, share)
            ),
            "size_class": size_class,
            "employees": employees.astype(np.int32),
            "turnover": turnover,
        }
    )
    step("enterprises", n_enterprises)

    counts = np.bincount(
        np.searchsorted(sorted(REGIONS), np.asarray(persons_table["region"])),
        minlength=len(REGIONS),
    )
    regions = pa.table(
        {
            "region": sorted(REGIONS),
            "name": [REGIONS[r] for r in sorted(REGIONS)],
            "population": (np.round(counts, -3) if persons >= 100_000 else counts).astype(np.int64),
        }
    )
    step("regions", len(REGIONS))
    benefits = _benefits(rng, persons_table)
    step("benefit payments", benefits.num_rows)
    return {
        "persons": persons_table,
        "households": households,
        "enterprises": enterprises,
        "regions": regions,
        "benefits": benefits,
    }


def _benefits(rng: np.random.Generator, persons: pa.Table) -> pa.Table:
    """Monthly benefit payments: about 12% of persons receive one or two schemes for 1 to 12
    months each, so one person has many rows (the DP demo table, bounded per person)."""
    n = persons.num_rows
    receivers = np.flatnonzero(rng.random(n) < 0.12)
    schemes = 1 + (rng.random(len(receivers)) < 0.25)
    person = np.repeat(receivers, schemes)
    scheme = rng.choice(len(SCHEMES), size=len(person), p=SCHEME_P)
    months = rng.integers(1, 13, len(person))
    row_person = np.repeat(person, months)
    row_scheme = np.repeat(scheme, months)
    month = np.arange(len(row_person)) - np.repeat(np.cumsum(months) - months, months) + 1
    base = np.array([250.0, 400.0, 900.0, 700.0])[row_scheme]
    amount = (base * np.exp(rng.normal(0, 0.3, len(row_person)))).round(2)
    ids = np.asarray(persons["person_id"])[row_person]
    return pa.table(
        {
            "person_id": ids.astype(np.int64),
            "region": np.asarray(persons["region"])[row_person],
            "scheme": np.array(SCHEMES)[row_scheme],
            "month": month.astype(np.int32),
            "amount": amount,
        }
    )


def _region_shares(muni_region: np.ndarray, share: np.ndarray) -> np.ndarray:
    totals = np.array([share[muni_region == r].sum() for r in REGIONS])
    return totals / totals.sum()


def write_tables(con, tables: dict[str, pa.Table]) -> None:
    """Create (or replace) the demo tables in a DuckDB connection."""
    for name, table in tables.items():
        con.register("__sqlsdc_demo_source", table)
        try:
            con.execute(f'CREATE OR REPLACE TABLE "{name}" AS SELECT * FROM __sqlsdc_demo_source')
        except EngineError as failure:
            # Ctrl-C or SIGTERM while DuckDB reads the Arrow table: DuckDB wraps the
            # KeyboardInterrupt raised in Python as "counting the rows ... failed", which the
            # CLI reported as an internal error instead of "Aborted!" (seen in CI)
            if "KeyboardInterrupt" in str(failure):
                raise KeyboardInterrupt from None
            raise
        finally:
            con.unregister("__sqlsdc_demo_source")
