"""``sqlsdc ptable`` through real processes (forked with sqlsdc imported, :mod:`cli_fork`) and
through click's runner."""

from __future__ import annotations

import io
import json

import cli_fork
import pandas as pd
import pytest
from click.testing import CliRunner
from sqlsdc.cli.main import cli

from sqlsdc.mechanisms.ptable import count_ptable, magnitude_ptable
from sqlsdc.mechanisms.ptable_files import from_csv, from_tauargus


def sqlsdc(*args, cwd=None):
    return cli_fork.run(["ptable", *args], cwd=cwd, timeout=120)


def run(*args, code=0):
    result = CliRunner().invoke(cli, ["ptable", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_tauargus_file_in_a_subprocess(tmp_path):
    out = tmp_path / "ptable.txt"
    result = sqlsdc(
        "--D", 5, "--V", 3, "--js", 2, "--pstay", 0.5, "--format", "tauargus", "--output", out
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    text = out.read_text(encoding="utf-8")
    assert text.startswith("i;j;p;v;p_int_ub\n0;0;1;0;1\n1;0;0.73446954;-1;0.73446954\n")
    assert "8;8;0.5;0;0.75" in text.splitlines()  # τ-ARGUS's ptab_freq.txt has this line
    assert from_tauargus(text).rows == count_ptable(D=5, V=3, js=2, pstay=0.5).rows


def test_magnitude_csv_in_a_subprocess():
    result = sqlsdc("--D", 5, "--V", 1, "--table", "nums", "--step", 2, "--format", "csv")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "i,j,p,v,p_int_lb,p_int_ub,type"
    frame = pd.read_csv(io.StringIO(result.stdout))
    assert frame["i"].unique().tolist() == [0, 1, 5]  # icat defaults to 1, D
    assert frame["p"].iloc[1] == pytest.approx(0.24006614, abs=1e-7)  # ptab_savings_all.txt
    expected = magnitude_ptable(D=5, V=1, step=2)
    assert from_csv(result.stdout, params=expected.params) == expected


@pytest.mark.parametrize(
    "args, message",
    [
        (["--D", 2, "--V", 5], "V=5.0 is unreachable"),
        (["--D", 3, "--V", 1, "--pstay", 1.5], "pstay must lie strictly between 0 and 1"),
        (["--D", 5, "--V", 1, "--table", "nums", "--icat", "1,x"], "--icat must be integers"),
        (["--D", 10**20, "--V", 3], "D (largest noise) must be an integer >= 1 and <= 100"),
        (["--D", 5, "--V", 3, "--js", 10**20], "js must be an integer >= 0 and <= 100"),
        (["--D", 5, "--V", 1, "--js", 10], "row i=1 may only move to 0"),  # "variances nan..nan"
        (["--D", 5, "--V", 1, "--pstay", 2], "and 1 (None: no bound); got 2.0\n"),  # (2.0, ...)
        (["--D", 5, "--V", 1, "--optim", 7], "(variance = V); got 7\n"),  # (7, 7, 7, 7, 7)
        (["--D", 5, "--V", 1, "--icat", "1,5"], "only: table 'nums' (--table nums)"),
    ],
)
def test_bad_parameters_exit_2_with_one_line(args, message):
    result = sqlsdc(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("sqlsdc: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_table_and_json_formats():
    table = run("--D", 2, "--V", 0.9).output
    assert table.splitlines()[0].split() == ["i", "j", "p", "v", "p_int_lb", "p_int_ub", "type"]
    assert "0.40927654" in table
    rows = json.loads(run("--D", 2, "--V", 0.9, "--format", "json").output)
    assert [(r["i"], r["j"], r["v"]) for r in rows[:2]] == [(0, 0, 0), (1, 0, -1)]
    assert rows[-1]["p_int_ub"] == 1


def test_check_shows_rs_emp_results():
    rows = json.loads(run("--D", 2, "--V", 1, "--check", "--format", "json").output)
    assert [r["iter"] for r in rows] == [0, 20, 1]
    assert rows[1]["p_var"] == pytest.approx(0.93188, abs=1e-5)
    assert rows[1]["var_reached"] is False and rows[2]["var_reached"] is True


def test_options_reach_the_generator():
    free = json.loads(run("-D", 7, "-V", 4, "--js", 2, "--optim", 4, "--no-mono",
                          "--format", "json").output)  # fmt: skip
    assert not any(1 <= r["j"] <= 2 for r in free if r["i"] > 0)
    expected = count_ptable(D=7, V=4, js=2, optim=4, mono=False).to_frame()
    assert [r["p"] for r in free] == pytest.approx(expected["p"].tolist(), abs=1e-12)
    odd = run("-D", 3, "-V", 1, "--table", "nums", "--step", 2, "--type", "odd", "--format", "csv")
    assert set(pd.read_csv(io.StringIO(odd.output))["type"]) == {"odd"}


def test_even_table_cannot_go_alone_to_tauargus():
    result = CliRunner().invoke(
        cli, ["ptable", "-D", "2", "-V", "1", "--table", "nums", "--type", "even", "--format",
              "tauargus"],
    )  # fmt: skip
    assert result.exit_code == 2 and "two of types 'even' and 'odd'" in result.output


def test_help():
    assert "Cell Key Method" in run("--help").output
    assert "ptable" in CliRunner().invoke(cli, ["--help"]).output
