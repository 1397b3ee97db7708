"""The peers of issue 19 in their own virtualenv (the `synth-peers` extra: SDV pins pandas < 3):
SDV GaussianCopula (and CTGAN with --ctgan), scored with the SDMetrics package, and the
SDMetrics score of the synthetic files bench_synth.py wrote (a check of sqlsdc's own
implementation of the score).

    python -m venv /tmp/peers && /tmp/peers/bin/pip install sdmetrics sdv smartnoise-synth
    python benchmarks/synth/bench_synth.py --reps 1 --write-csv /tmp/synth-csv
    /tmp/peers/bin/python benchmarks/synth/bench_peers.py /tmp/synth-csv [--ctgan]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
from sdmetrics.reports.single_table import QualityReport
from sdv.metadata import Metadata
from sdv.single_table import CTGANSynthesizer, GaussianCopulaSynthesizer

DATA = Path("/work/shared/data")


def score(real, synthetic, metadata) -> float:
    report = QualityReport()
    report.generate(real, synthetic, metadata.to_dict()["tables"]["t"], verbose=False)
    return report.get_score()


def main() -> None:
    csv = Path(sys.argv[1])
    peers = {"GaussianCopula": GaussianCopulaSynthesizer}
    if "--ctgan" in sys.argv:
        peers["CTGAN"] = CTGANSynthesizer
    print("| data | method | SDMetrics quality | time (s) |")
    print("|---|---|---|---|")
    for name in ("casc_census", "tarragona", "sd2011"):
        real = pd.read_csv(DATA / f"{name}.csv")
        metadata = Metadata.detect_from_dataframes({"t": real})
        for own in sorted(csv.glob(f"{name}.*.csv")):
            method = own.name.split(".")[1]
            quality = score(real, pd.read_csv(own), metadata)
            print(f"| {name} | sqlsdc {method} (file) | {quality:.4f} | |")
        for label, peer in peers.items():
            started = time.perf_counter()
            model = peer(metadata)
            model.fit(real)
            synthetic = model.sample(len(real))
            seconds = time.perf_counter() - started
            print(
                f"| {name} | SDV {label} | {score(real, synthetic, metadata):.4f} | {seconds:.1f} |"
            )


if __name__ == "__main__":
    main()
