"""The peers of issue 19 in their own virtualenv (the `synth-peers` extra: SDV pins pandas < 3):
SDV GaussianCopula (and CTGAN with --ctgan), scored with the SDMetrics package, and the
SDMetrics score of the synthetic files bench_synth.py wrote (a check of sqlsdc's own
implementation of the score); with --smartnoise also smartnoise-synth's MST and AIM at ε = 1
(each numeric column cut into 20 bins between its minimum and maximum, given as public bounds:
a favour to those peers, which otherwise spend budget finding them; CASC only, the others take
minutes per run).

    python -m venv /tmp/peers && /tmp/peers/bin/pip install sdmetrics sdv smartnoise-synth
    python benchmarks/synth/bench_synth.py --reps 1 --write-csv /tmp/synth-csv
    /tmp/peers/bin/python benchmarks/synth/bench_peers.py /tmp/synth-csv [--ctgan] [--smartnoise]
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
    for name in ("casc_census", "tarragona", "sd2011", "demo_persons"):
        shared = DATA / f"{name}.csv"
        real = pd.read_csv(shared if shared.exists() else csv / "real" / f"{name}.csv")
        metadata = Metadata.detect_from_dataframes({"t": real})
        scores: dict[str, list[float]] = {}
        for own in sorted(csv.glob(f"{name}.*.csv")):
            method = own.name.split(".")[1]
            scores.setdefault(method, []).append(score(real, pd.read_csv(own), metadata))
        for method, found in scores.items():
            mean = sum(found) / len(found)
            print(
                f"| {name} | sqlsdc {method} ({len(found)} files) | {mean:.4f} "
                f"(min {min(found):.4f}) | |"
            )
        for label, peer in peers.items():
            started = time.perf_counter()
            model = peer(metadata)
            model.fit({"t": real})  # SDV 2.0 takes and returns {table name: DataFrame}
            synthetic = model.sample(len(real))
            if isinstance(synthetic, dict):
                synthetic = synthetic["t"]
            seconds = time.perf_counter() - started
            print(
                f"| {name} | SDV {label} | {score(real, synthetic, metadata):.4f} | {seconds:.1f} |"
            )
        if "--smartnoise" in sys.argv and name == "casc_census":
            for method in ("mst", "aim"):
                started = time.perf_counter()
                synthetic = smartnoise(real, method)
                seconds = time.perf_counter() - started
                quality = score(real, synthetic, metadata)
                print(
                    f"| {name} | smartnoise {method.upper()} (ε = 1) | {quality:.4f} | "
                    f"{seconds:.1f} |"
                )


def smartnoise(real: pd.DataFrame, method: str) -> pd.DataFrame:
    from snsynth import Synthesizer
    from snsynth.transform import BinTransformer, TableTransformer

    bins = TableTransformer([
        BinTransformer(lower=float(real[c].min()), upper=float(real[c].max()), bins=20,
                       nullable=False)
        for c in real.columns
    ])  # fmt: skip
    return Synthesizer.create(method, epsilon=1.0, verbose=False).fit_sample(real, transformer=bins)


if __name__ == "__main__":
    main()
