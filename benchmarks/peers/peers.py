"""The peer systems of the side-by-side harness: OpenDP, SmartNoise SQL and PipelineDP.

Run by ``run.py`` in a separate virtualenv (the peers pin versions of OpenDP, polars and
SQLAlchemy that differ from sqlsdc's). Reads the harness data (``persons.parquet``,
``benefits.parquet``) and the questions (``questions.json``) from a work directory and writes,
for every repetition, the released cells and the seconds from an in-memory data frame to the
released result.

Usage: python peers.py WORKDIR SYSTEM REPS   (SYSTEM: opendp, smartnoise or pipelinedp)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pandas as pd

SYSTEMS = {}


def system(name):
    def register(run):
        SYSTEMS[name] = run
        return run

    return register


def key(values) -> str:
    return "|".join(str(v) for v in values)


# --- OpenDP (polars Context API) ------------------------------------------------------------


@system("opendp")
def run_opendp(q, frame):
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    by = q["by"]
    public = q["keys"] is not None
    margin = dp.polars.Margin(
        by=by,
        max_length=q["max_length"],
        max_groups=len(q["keys"]) if public else None,
        invariant="keys" if public else None,
    )
    loss = dp.loss_of(epsilon=q["epsilon"], delta=q["delta"] if q["delta"] else None)
    lf = pl.from_pandas(frame[by + ([q["measure"]] if q["measure"] else [])]).lazy()
    context = dp.Context.compositor(
        data=lf,
        privacy_unit=dp.unit_of(contributions=q["unit_rows"]),
        privacy_loss=loss,
        split_evenly_over=1,
        margins=[margin, dp.polars.Margin(by=[], max_length=q["max_length"])],
    )
    bounds = tuple(q["bounds"]) if q["bounds"] else None
    if q["agg"] == "count":
        expr = dp.len().alias("v")
    elif q["agg"] == "sum":
        expr = pl.col(q["measure"]).fill_null(0.0).dp.sum(bounds).alias("v")
    else:
        expr = pl.col(q["measure"]).fill_null(0.0).dp.mean(bounds).alias("v")
    out = context.query().group_by(by).agg(expr).release().collect()
    return {key(row[:-1]): float(row[-1]) for row in out.select(by + ["v"]).iter_rows()}


# --- SmartNoise SQL ---------------------------------------------------------------------------


@system("smartnoise")
def run_smartnoise(q, frame):
    import snsql
    from snsql import Privacy

    table = {
        "max_ids": q["unit_rows"],
        "row_privacy": False,
        "censor_dims": q["keys"] is None,
        "sample_max_ids": True,
        "pid": {"type": "int", "private_id": True},
    }
    for column in q["by"]:
        table[column] = {"type": "string"}
    if q["measure"]:
        low, high = q["bounds"]
        table[q["measure"]] = {"type": "float", "lower": low, "upper": high, "nullable": False}
    meta = {"harness": {"data": {"t": table}}}
    columns = ["pid"] + q["by"] + ([q["measure"]] if q["measure"] else [])
    df = frame[columns]
    agg = {"count": "COUNT(*)", "sum": f"SUM({q['measure']})", "avg": f"AVG({q['measure']})"}
    by = ", ".join(q["by"])
    sql = f"SELECT {by}, {agg[q['agg']]} AS v FROM data.t GROUP BY {by}"
    delta = q["delta"] or 0.0
    probe = snsql.from_df(df, privacy=Privacy(epsilon=1.0, delta=delta), metadata=meta)
    cost, _ = probe.get_privacy_cost(sql)  # epsilon charged per measured column: scale it
    reader = snsql.from_df(
        df, privacy=Privacy(epsilon=q["epsilon"] / cost, delta=delta), metadata=meta
    )
    rows = reader.execute(sql)
    return {key(row[:-1]): float(row[-1]) for row in rows[1:] if row[-1] is not None}


# --- PipelineDP (local backend) ---------------------------------------------------------------


@system("pipelinedp")
def run_pipelinedp(q, frame):
    import pipeline_dp

    accountant = pipeline_dp.NaiveBudgetAccountant(
        total_epsilon=q["epsilon"], total_delta=q["delta"] or 0.0
    )
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    metric = {
        "count": pipeline_dp.Metrics.COUNT,
        "sum": pipeline_dp.Metrics.SUM,
        "avg": pipeline_dp.Metrics.MEAN,
    }[q["agg"]]
    low, high = q["bounds"] or (0, 1)
    if q["unit_rows"] > 1:  # a total cap per person across the whole query
        caps = {"max_contributions": q["unit_rows"]}
    else:
        caps = {"max_partitions_contributed": 1, "max_contributions_per_partition": 1}
    params = pipeline_dp.AggregateParams(
        metrics=[metric], noise_kind=pipeline_dp.NoiseKind.LAPLACE, min_value=low,
        max_value=high, **caps,
    )  # fmt: skip
    by, measure = q["by"], q["measure"]
    columns = ["pid"] + by + ([measure] if measure else [])
    rows = list(frame[columns].itertuples(index=False, name=None))
    nby = len(by)
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0],
        partition_extractor=lambda r: key(r[1 : 1 + nby]),
        value_extractor=(lambda r: r[-1]) if measure else (lambda r: 0),
    )
    public = [key(k) for k in q["keys"]] if q["keys"] is not None else None
    result = engine.aggregate(rows, params, extractors, public_partitions=public)
    accountant.compute_budgets()
    name = {"count": "count", "sum": "sum", "avg": "mean"}[q["agg"]]
    return {k: float(getattr(m, name)) for k, m in result}


IMPORTS = {
    "opendp": lambda: (__import__("opendp.prelude"), __import__("polars")),
    "smartnoise": lambda: __import__("snsql"),
    "pipelinedp": lambda: __import__("pipeline_dp"),
}


def main() -> None:
    workdir, name, reps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    questions = json.loads((workdir / "questions.json").read_text())
    tables = {t: pd.read_parquet(workdir / f"{t}.parquet") for t in ("persons", "benefits")}
    IMPORTS[name]()  # libraries loaded before the clock starts
    runs = []
    for q in questions:
        frame = tables[q["table"]]
        for rep in range(reps):
            start = time.perf_counter()
            try:
                cells = SYSTEMS[name](q, frame)
                error = None
            except Exception as exc:  # a peer that cannot answer: reported, not fatal
                cells, error = {}, f"{type(exc).__name__}: {exc}"[:300]
            seconds = time.perf_counter() - start
            runs.append({"system": name, "q": q["id"], "rep": rep, "seconds": seconds,
                         "cells": cells, "error": error})  # fmt: skip
            print(f"{name} {q['id']} rep {rep}: {seconds:.2f} s {error or ''}", file=sys.stderr)
            if error:
                break
    (workdir / f"peer-{name}.json").write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
