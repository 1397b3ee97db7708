"""The utility and disclosure report of a stored synthetic table (``sqlsdc synth-report``).

Admins only: the report compares the synthetic records with the confidential records they were
made from, read with the source query the synthesis job stored in ``sqlsdc.outputs`` (or a
confidential table of the policy given as ``against``). It is written as JSON and HTML, with
PNG plots when matplotlib (the ``report`` extra) is installed: the two-way utility U of every
pair of variables as a heat map, and each variable's original and synthetic marginals side by
side.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from sqlglot import exp

from sqlsdc.catalog import store
from sqlsdc.catalog.store import require_admin
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import Error, NotFoundError, SynthesisError
from sqlsdc.jobs.session import job_catalog
from sqlsdc.policy import load_policy
from sqlsdc.synth.cart import is_categorical
from sqlsdc.synth.disclosure import disco, identical_share, replicated_uniques, tcap
from sqlsdc.synth.utility import (
    marginal_distances,
    propensity_pmse,
    quality_score,
    utility_tables,
)

__all__ = ["synth_report", "measure"]

SCHEMA = "protected"
COPY = "synthetic_copy"


def measure(
    original: pd.DataFrame,
    synthetic: pd.DataFrame,
    *,
    keys: Sequence[str] | None = None,
    target: str | None = None,
) -> dict:
    """Utility and disclosure of ``synthetic`` against ``original`` (same columns): the
    SDMetrics quality score, mean and worst two- and three-way U, the logistic propensity pMSE
    ratio, marginal distances; the share of synthetic records identical to an original one,
    replicated uniques on ``keys`` (default all columns) and, with a ``target``, TCAP and
    DiSCO for ``keys``."""
    columns = list(original.columns)
    result = {
        "records": {"original": len(original), "synthetic": len(synthetic)},
        "utility": {
            "quality": quality_score(original, synthetic),
            "two_way": utility_tables(original, synthetic, way=2),
            "three_way": utility_tables(original, synthetic, way=3) if len(columns) <= 12 else None,
            "propensity": propensity_pmse(original, synthetic),
            "marginals": marginal_distances(original, synthetic),
        },
        "disclosure": {
            "identical_share": identical_share(original, synthetic),
            "replicated_uniques": replicated_uniques(original, synthetic, keys or columns),
        },
    }
    if target is not None:
        if not keys:
            raise SynthesisError("--target needs --keys: the variables an intruder knows")
        result["disclosure"]["tcap"] = tcap(original, synthetic, keys, target)
        result["disclosure"]["disco"] = disco(original, synthetic, keys, target)
    return result


def synth_report(
    db: str | Path,
    table: str,
    *,
    user: str,
    against: str | None = None,
    keys: Sequence[str] | None = None,
    target: str | None = None,
    out: str | Path | None = None,
) -> dict:
    """Measure the synthetic table ``protected.NAME`` of ``db`` against its source and write
    the report into ``out`` (default: ``NAME_report/`` next to the database file).

    Returns the measures with the paths of the files written (``files``)."""
    name = table.split(".", 1)[1] if table.startswith(f"{SCHEMA}.") else table
    request = json.dumps({"job": "synth-report", "table": f"{SCHEMA}.{name}", "against": against})
    # it reads confidential records: audited like a job (accepted or refused, by whom)
    with job_catalog(db, user, "synth-report", name, request) as (con, _id, _fp, audit):
        try:
            version, document, source_name = require_admin(con, user)
            policy = load_policy(document, name=source_name)
            synthetic = _read_synthetic(con, name)
            source_sql = _source_sql(con, policy, name, against)
            try:
                original = con.sql(source_sql).df()
            except Exception:  # the engine's text is not shown
                raise SynthesisError(
                    f"the source records of {SCHEMA}.{name} could not be read; name a "
                    "confidential table with --against"
                ) from None
        except Error as refusal:
            audit("refused", reason=store.audit_reason(refusal))
            raise
        audit("accepted")
    copies = int(synthetic[COPY].max()) if COPY in synthetic else 1
    if COPY in synthetic:  # the measures describe the first copy
        synthetic = synthetic[synthetic[COPY] == 1].drop(columns=COPY)
    missing = [c for c in synthetic.columns if c not in original.columns]
    if missing:
        raise SynthesisError(f"the source has no column {missing}; name it with --against")
    # named as the policy names them, whatever their case: a user's own table spells
    # NACE_Section, and --keys nace_section was "not a column" (new user s48e)
    spelt = {str(c).lower(): c for c in synthetic.columns}
    for column in [*(keys or []), *([target] if target else [])]:
        if column.lower() not in spelt:
            raise SynthesisError(
                f"{column!r} is not a column of {SCHEMA}.{name}: {', '.join(synthetic.columns)}"
            )
    keys = None if keys is None else [spelt[k.lower()] for k in keys]
    target = None if target is None else spelt[target.lower()]
    original = original[list(synthetic.columns)]
    result = {
        "table": f"{SCHEMA}.{name}",
        "source": against or "stored source query",
        "copies": copies,
        **measure(original, synthetic, keys=keys, target=target),
    }
    result["files"] = _write(report_folder(db, table, out), result, original, synthetic)
    return result


def report_folder(db: str | Path, table: str, out: str | Path | None = None) -> Path:
    """The folder a report of ``table`` is written into: ``out``, or ``NAME_report/`` next to
    the database file."""
    name = table.split(".", 1)[1] if table.startswith(f"{SCHEMA}.") else table
    return Path(out) if out is not None else Path(db).resolve().parent / f"{name}_report"


def _read_synthetic(con, name: str) -> pd.DataFrame:
    exists = engine.one(
        con,
        "SELECT 1 FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
        [SCHEMA, name],
    )
    if exists is None:  # an admin's command: the stored outputs may be named
        stored = con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = ? ORDER BY 1", [SCHEMA]
        ).fetchall()
        raise NotFoundError(
            f"{SCHEMA}.{name} does not exist (stored: "
            f"{', '.join(t for (t,) in stored) or 'none'}); store one with `sqlsdc synthesize`"
        )
    query = exp.select("*").from_(exp.table_(name, db=SCHEMA, quoted=True))
    return con.sql(query.sql("duckdb")).df()


def _source_sql(con, policy, name: str, against: str | None) -> str:
    """The SELECT of the source records: ``against`` (a confidential table of the policy) or
    the query stored by the synthesis job in ``sqlsdc.outputs``."""
    if against is not None:
        declared = policy.declared(against)
        if declared.is_public:
            raise SynthesisError(
                f"--against {against!r} is not a confidential table of the policy "
                f"({', '.join(sorted(t.name for t in policy.confidential_tables))})"
            )
        return exp.select("*").from_(exp.table_(declared.name, quoted=True)).sql("duckdb")
    row = engine.one(
        con, f"SELECT sql_text, report FROM {store.S}.outputs WHERE name = ?", [f"{SCHEMA}.{name}"]
    )
    if row is None:
        raise SynthesisError(
            f"{SCHEMA}.{name} has no stored source; name a confidential table with --against"
        )
    report = json.loads(row[1])
    if not report.get("synthetic"):
        raise SynthesisError(f"{SCHEMA}.{name} is not a synthetic table (see `sqlsdc publish`)")
    return report.get("source_sql") or row[0]


def _write(folder: Path, result: dict, original: pd.DataFrame, synthetic: pd.DataFrame) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    files = {"json": str(folder / "report.json"), "html": str(folder / "report.html")}
    plots = _plots(folder, result, original, synthetic)
    files.update(plots)
    Path(files["json"]).write_text(json.dumps(_jsonable({**result, "files": files}), indent=2))
    Path(files["html"]).write_text(_html(result, plots))
    return files


def _plots(folder: Path, result: dict, original, synthetic) -> dict:
    """PNG plots, or none when matplotlib is not installed (the report says so)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    columns = list(original.columns)
    k = len(columns)
    grid = np.full((k, k), np.nan)
    for pair, u in result["utility"]["two_way"]["tables"].items():
        a, b = pair.split(" × ")
        i, j = columns.index(a), columns.index(b)
        grid[i, j] = grid[j, i] = u
    fig, ax = plt.subplots(figsize=(1 + 0.5 * k, 1 + 0.45 * k))
    image = ax.imshow(grid, cmap="viridis_r")
    ax.set_xticks(range(k), columns, rotation=90, fontsize=7)
    ax.set_yticks(range(k), columns, fontsize=7)
    ax.set_title("two-way utility U (1 = as expected)", fontsize=9)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    heat = folder / "utility_pairs.png"
    fig.savefig(heat, dpi=110)
    plt.close(fig)
    cols = min(4, k)
    rows = math.ceil(k / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, column in zip(axes.ravel(), columns, strict=False):
        o, s = original[column], synthetic[column]
        if is_categorical(o) or o.nunique() <= 12:
            shares = pd.DataFrame({
                "original": o.astype(object).fillna("NA").value_counts(normalize=True),
                "synthetic": s.astype(object).fillna("NA").value_counts(normalize=True),
            }).fillna(0).head(15)  # fmt: skip
            shares.plot.bar(ax=ax, legend=False, fontsize=6)
        else:
            bins = np.histogram_bin_edges(o.dropna(), bins=30)
            ax.hist([o.dropna(), s.dropna()], bins=bins, label=["original", "synthetic"])
        ax.set_title(column, fontsize=8)
    for ax in axes.ravel()[k:]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=6)
    fig.tight_layout()
    marginals = folder / "marginals.png"
    fig.savefig(marginals, dpi=90)
    plt.close(fig)
    return {"utility_pairs": str(heat), "marginals": str(marginals)}


def _html(result: dict, plots: dict) -> str:
    u, d = result["utility"], result["disclosure"]
    ru = d["replicated_uniques"]
    rows = [
        ("SDMetrics quality score", f"{u['quality']['score']:.4f}"),
        (
            "mean / worst two-way U",
            f"{u['two_way']['mean']:.3f} / {u['two_way']['worst']:.3f} "
            f"({u['two_way']['worst_table']})",
        ),  # fmt: skip
        ("propensity pMSE ratio (logistic)", f"{u['propensity']['ratio']:.3f}"),
        ("synthetic records identical to an original", f"{d['identical_share']:.2%}"),
        ("replicated uniques ru (% of records)", f"{ru['ru']:.2f} (of p1 = {ru['p1']:.2f})"),
    ]
    if u["three_way"]:
        three = u["three_way"]
        rows.insert(2, ("mean / worst three-way U", f"{three['mean']:.3f} / {three['worst']:.3f}"))
    if "tcap" in d:
        rows.append(("TCAP (baseline)", f"{d['tcap']['tcap']} ({d['tcap']['baseline']:.3f})"))
        rows.append(("DiSCO (%)", f"{d['disco']['disco']:.2f}"))
    table = "\n".join(
        f"<tr><th>{html.escape(a)}</th><td>{html.escape(b)}</td></tr>" for a, b in rows
    )
    images = (
        "\n".join(
            f'<h2>{html.escape(label)}</h2><img alt="{html.escape(label)}" '
            f'src="data:image/png;base64,{base64.b64encode(Path(path).read_bytes()).decode()}">'
            for label, path in plots.items()
        )
        or "<p>Plots need matplotlib: <code>pip install 'sqlsdc[report]'</code>.</p>"
    )
    title = html.escape(f"Synthetic data report: {result['table']}")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body><h1>{title}</h1><p>{result['records']['synthetic']} synthetic records against "
        f"{result['records']['original']} original ({html.escape(result['source'])}); "
        f"{result['copies']} copies.</p><table>{table}</table>{images}</body></html>"
    )


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value
