"""Risk against utility of several anonymised files, so an officer can choose a setting.

Each candidate is the stored report of an ``sqlsdc anonymize`` run (the same records protected
with other steps or parameters). :func:`tradeoff` puts them side by side: the risk left
(expected re-identifications and global Benedetti–Franconi risk after the steps, records still
below k = 3, record linkage) against the information lost (IL = 100·SSE/SST over the changed
numeric columns, local suppressions, PRAM changes). :func:`plot_tradeoff` draws risk against
information loss, one labelled point per candidate, as a PNG or as an HTML page holding the
plot and the table (matplotlib, the optional extra ``report``).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path

from sqlsdc.errors import MicrodataError
from sqlsdc.files import write_atomically

__all__ = ["plot_tradeoff", "tradeoff"]

COLUMNS = ("name", "expected_reidentifications", "global_risk", "below_3", "linkage",
           "information_loss", "suppressed", "pram_changed")  # fmt: skip


def tradeoff(reports: Sequence[dict]) -> list[dict]:
    """One row per stored report: the figures named in :data:`COLUMNS` (``None`` where the
    report has no such measure, e.g. no key variables or no changed numeric column)."""
    rows = []
    for r in reports:
        after = r.get("after") or {}
        loss = r.get("information_loss") or {}
        overall = loss.get("all") or (next(iter(loss.values())) if len(loss) == 1 else None)
        steps = r.get("steps", [])
        rows.append({
            "name": r["name"],
            "expected_reidentifications": after.get("expected_reidentifications"),
            "global_risk": after.get("global_risk"),
            "below_3": (after.get("violations") or {}).get("3"),
            "linkage": (r.get("linkage") or {}).get("euclidean"),
            "information_loss": overall["il"] if overall else None,
            "suppressed": sum(sum(s["suppressed"].values()) for s in steps if "suppressed" in s),
            "pram_changed": sum(v["changed"] for s in steps for v in s.values()
                                if isinstance(v, dict) and "changed" in v),
        })  # fmt: skip
    return rows


def plot_tradeoff(rows: Sequence[dict], path: str | Path) -> Path:
    """Write the risk–utility plot of :func:`tradeoff` rows to ``path`` (``.png`` or ``.html``).

    x: information loss (IL, or suppressions plus PRAM changes as a share of records when no
    numeric column changed); y: expected re-identifications after the steps.

    Raises:
        MicrodataError: an unknown suffix, no candidate with a risk figure, or matplotlib
            missing (``pip install 'sqlsdc[report]'``).
    """
    path = Path(path)
    if path.suffix.lower() not in (".png", ".html"):
        raise MicrodataError(f"write the plot as .png or .html, not {path.suffix or path.name!r}")
    points = [r for r in rows if r["expected_reidentifications"] is not None]
    if not points:
        raise MicrodataError("no candidate has a risk figure: run anonymize with --keys")
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        raise MicrodataError("plots need matplotlib: pip install 'sqlsdc[report]'") from None
    use_il = all(r["information_loss"] is not None for r in points)
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    try:
        for r in points:
            x = r["information_loss"] if use_il else r["suppressed"] + r["pram_changed"]
            ax.scatter([x], [r["expected_reidentifications"]], color="tab:blue")
            ax.annotate(r["name"].split(".")[-1], (x, r["expected_reidentifications"]),
                        textcoords="offset points", xytext=(5, 4), fontsize=8)  # fmt: skip
        ax.set_xlabel("information loss (IL = 100·SSE/SST)" if use_il
                      else "values suppressed or PRAM-changed")  # fmt: skip
        ax.set_ylabel("expected re-identifications after")
        ax.set_title("Risk against information loss of the candidate files")
        ax.grid(alpha=0.3)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    png = buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    content = png if path.suffix.lower() == ".png" else _page(rows, png).encode("utf-8")
    write_atomically(path, content)  # readers see the old plot or the whole new one
    return path


def _page(rows: Sequence[dict], png: bytes) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(r[c]))}</td>" for c in COLUMNS) + "</tr>"
        for r in rows
    )
    image = base64.b64encode(png).decode("ascii")
    return (
        "<!doctype html><meta charset='utf-8'><title>sqlsdc: risk and utility</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}</style>"
        f"<h1>Risk and information loss of {len(rows)} candidate files</h1>"
        f"<img alt='risk against information loss' src='data:image/png;base64,{image}'>"
        f"<table><tr>{head}</tr>{body}</table>"
    )


def _cell(value) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}" if isinstance(value, float) else str(value)
