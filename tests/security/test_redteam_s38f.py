"""Red team s38f: the jobs' differencing checks as merged by hand in session 38 (red teams
s38b and s38e, the files compared when released, the policy's checks passed in by the caller),
attacked by varying the order of jobs, files, policy applies and publications.

Closed here (each test failed before its fix):

- **A signed sum of exact tables and several anonymised files.** s38b's four populations
  (85+ of R02 ∪ R03 ∪ {one person}, R02 ∪ R03 ∪ R04, R02 ∪ R04, R02): two as suppression
  jobs of income by sex, two as anonymised files of sex and income (income only top-coded).
  Each pair differs on both sides or by a whole region; T1 - T2 + T3 - T4 is that person's
  income. A job next to the others is refused (its check counts every stored file), but a
  file's check summed it with the exact tables only, and files with each other pairwise: the
  last file was stored next to the released one (either file last), and two candidates were
  released together by a policy's ``releases:`` or ``publish --include``. Where files become
  released together (``sqlsdc.jobs.file_pairs.refuse_file_pairs``) each is now also summed
  with the others and the exact tables of its table.
- **An opaque file and another file of its table released together.** Everyone aged 85+ as a
  derived table and the same people but one municipality's person as a WHERE (s38e's opaque
  file, income only top-coded): the opaque file is refused next to exact tables only, and
  the release-time file check read plain files only, so listing both, publishing both, or
  storing one next to the other released was accepted; the totals differ by that person's
  income. Refused now on all three paths (``file_pairs.refuse_opaque_files``,
  ``anonymize._released_with``); stored side by side as candidates, still allowed.

Changed after this round: the suppression pattern's check at policy apply raised
``TabularError`` (CLI exit 1) where the check of the files ``releases:`` lists raises
``PolicyError`` (exit 4) for the same kind of refusal; both are ``PolicyError`` now.

Left open (observations, no test):

- A file's cuts are its exact columns that read a column the policy *now* declares a
  dimension (``record_files.file_release``), where stored jobs are read whatever the roles
  (s38b); a policy that demotes a dimension drops a stored file's cells from the check (not
  turned into an attack in the time: a job cannot group by the demoted column either).
- Two opaque files, or an opaque file and a plain one, stored unlisted: allowed as
  candidates (``test_record_files``' strict xfail stands: its expectation is a refusal at
  store time).

Tried and held (tests below where marked): the blanked-cells check (``_blanked_difference``)
is called on every path that compares a file with a table — a new job against a stored file
and the suppression pattern against stored files at policy apply
(``refuse_small_differences``), a new file against stored tables, and file against file when
stored next to a released one, listed together or published together
(``refuse_file_differences`` via ``file_pairs._compare``; test: a 3-anonymous file and a
file of the same people's municipalities, every order and path); a replaced job's first
version is compared with the pattern switched on at policy apply (test); a job after two
files and a job is refused by the signed sum (test); the policy's checks are passed by every
caller of ``apply_policy`` (``admin.init``, ``admin.apply``, ``sqlsdc.init``; the demo build
passes none on a new database); ``releases:`` and ``--include`` names are compared in lower
case on every path.
"""

from __future__ import annotations

import pytest

from sqlsdc import admin
from sqlsdc.errors import MicrodataError, PolicyError, TabularError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy
from sqlsdc.tabular.rules import FrequencyRule
from tests.security.test_redteam_s38b import _lonely

# ------------------------------------ a signed sum of exact tables and anonymised files


def _populations(db) -> dict[str, str]:
    municipality, region, _education, _income = _lonely(db)
    assert region == "R01"
    return {
        "t1": f"region IN ('R02', 'R03') OR municipality = '{municipality}'",
        "t2": "region IN ('R02', 'R03', 'R04')",
        "t3": "region IN ('R02', 'R04')",
        "t4": "region = 'R02'",
    }


def _job(db, populations, name: str) -> None:
    protect_query(db, "admin", "SELECT sex, SUM(income) FROM persons WHERE "
                  f"age >= 85 AND ({populations[name]}) GROUP BY sex", into=name)  # fmt: skip


def _file(db, populations, name: str) -> None:
    sql = f"SELECT sex, income FROM persons WHERE age >= 85 AND ({populations[name]})"
    anonymize(db, user="admin", into=name, steps=["topcode:income:upper=1e9"], sql=sql)


def _releasing(db, *names):
    _version, document, _history = admin.show(db)
    admin.apply(db, load_policy({**document, "releases": list(names)}), "admin")


def _t1_t4_released_then_jobs_t2_t3(db) -> None:
    populations = _populations(db)
    _releasing(db, "t1", "t4")
    _job(db, populations, "t2")
    _job(db, populations, "t3")


@pytest.mark.parametrize("last", ["t1", "t4"])
def test_two_jobs_and_two_released_files_whose_signed_sum_is_one_person(jobs_state, tmp_path, last):
    """t2 and t3 suppression jobs, t1 and t4 anonymised files listed under ``releases:``:
    the second file is refused (it isolates the person with the other three)."""
    jobs_demo_db = jobs_state(_t1_t4_released_then_jobs_t2_t3, tmp_path)
    populations = _populations(jobs_demo_db)
    _file(jobs_demo_db, populations, "t4" if last == "t1" else "t1")
    with pytest.raises(MicrodataError, match="would isolate 1 unit"):
        _file(jobs_demo_db, populations, last)


def test_two_candidate_files_released_together_whose_signed_sum_is_one_person(
    jobs_demo_db, tmp_path, sqlsdc_in_process
):
    """The same two files stored as candidates (not released, each stored next to the two
    jobs); a policy listing both is refused, and the policy in force stays; a publication
    including both is refused (exit 3, nothing written)."""
    populations = _populations(jobs_demo_db)
    _job(jobs_demo_db, populations, "t2")
    _job(jobs_demo_db, populations, "t3")
    _file(jobs_demo_db, populations, "t1")
    _file(jobs_demo_db, populations, "t4")
    version = admin.show(jobs_demo_db)[0]
    with pytest.raises(PolicyError, match="would isolate 1 unit"):
        _releasing(jobs_demo_db, "t1", "t4")
    assert admin.show(jobs_demo_db)[0] == version
    out = tmp_path / "release.duckdb"
    refused = sqlsdc_in_process("publish", jobs_demo_db, out, "--include", "t1",
                                "--include", "t4")  # fmt: skip
    assert refused.returncode == 3, refused.stderr
    assert "would isolate 1 unit" in refused.stderr.replace("\n", " ")
    assert not out.exists()
    _releasing(jobs_demo_db, "t1")


def _files_t1_t4(db) -> None:
    populations = _populations(db)
    _file(db, populations, "t1")
    _file(db, populations, "t4")


@pytest.mark.parametrize("last", ["t2", "t3"])
def test_a_job_after_two_files_and_a_job_is_refused(jobs_state, tmp_path, last):
    """Held: a job's check sums it with every stored file (released or not)."""
    jobs_demo_db = jobs_state(_files_t1_t4, tmp_path)
    populations = _populations(jobs_demo_db)
    _job(jobs_demo_db, populations, "t3" if last == "t2" else "t2")
    with pytest.raises(TabularError, match="would isolate 1 unit"):
        _job(jobs_demo_db, populations, last)


# ------------------------------------ a file's blanked cells next to another file's counts

BLANKED = ("SELECT municipality, sex, education FROM persons WHERE age >= 85",
           "suppress:municipality,sex,education:k=3,importance=3/2/1")  # fmt: skip
COUNTED = "SELECT municipality, income FROM persons WHERE age >= 85"


def _blanked(db) -> None:
    anonymize(db, user="admin", into="blanked", sql=BLANKED[0], steps=[BLANKED[1]])


def _counted(db) -> None:
    anonymize(db, user="admin", into="counted", sql=COUNTED, steps=["topcode:income:upper=1e9"])


@pytest.mark.parametrize("first", ["blanked", "counted"])
def test_a_blanked_file_next_to_a_released_file_of_the_same_people(jobs_demo_db, first):
    """s37c's 3-anonymous file of everyone aged 85+ (municipalities blanked) and a file of
    the same people's municipalities as they are: the second's count of a municipality less
    the first's shown records places blanked values. Each stored next to the other released."""
    files = {"blanked": _blanked, "counted": _counted}
    second = "counted" if first == "blanked" else "blanked"
    _releasing(jobs_demo_db, first)
    files[first](jobs_demo_db)
    with pytest.raises(MicrodataError, match="blanked values of municipality"):
        files[second](jobs_demo_db)


def test_a_blanked_file_and_a_file_of_the_same_people_released_together(
    jobs_demo_db, tmp_path, sqlsdc_in_process
):
    _blanked(jobs_demo_db)
    _counted(jobs_demo_db)
    with pytest.raises(PolicyError, match="blanked values of municipality"):
        _releasing(jobs_demo_db, "blanked", "counted")
    refused = sqlsdc_in_process("publish", jobs_demo_db, tmp_path / "r.duckdb", "--include",
                                "blanked", "--include", "counted")  # fmt: skip
    assert refused.returncode == 3, refused.stderr
    assert "blanked values of municipality" in refused.stderr.replace("\n", " ")


# ---------------------------------------------- earlier versions when a policy is applied


def test_suppression_switched_on_after_a_replaced_job(jobs_demo_db):
    """An exact job of everyone aged 1+ by municipality and sex, replaced by one of the same
    people by sex only; then suppression by geography x sex switched on: its pattern less the
    first version (which its readers keep) is the persons aged 0 of a cell. Refused, naming
    that version (held)."""
    from tests.conftest import suppress_document

    sql = "SELECT {0}, COUNT(*) FROM persons WHERE age >= 1 GROUP BY {0}"
    protect_query(jobs_demo_db, "admin", sql.format("municipality, sex"), into="aged",
                  rules=[FrequencyRule(5)])  # fmt: skip
    protect_query(jobs_demo_db, "admin", sql.format("sex"), into="aged",
                  rules=[FrequencyRule(5)], replace=True)  # fmt: skip
    with pytest.raises(PolicyError, match=r"suppression pattern of persons and that of "
                       r"protected\.aged as job \d+ stored it overlap"):  # fmt: skip
        admin.apply(jobs_demo_db, load_policy(suppress_document()), "admin")


# ----------------------------------- an opaque file and a file of its table released together

OPAQUE = "SELECT region, sex, education, income FROM (SELECT * FROM persons) AS p WHERE age >= 85"


def test_an_opaque_file_and_a_file_of_its_table_released_together(
    jobs_demo_db, tmp_path, sqlsdc_in_process
):
    """Everyone aged 85+ as a derived table (income only top-coded) and the same people but
    one municipality's person as a plain WHERE, both stored as candidates: the two totals
    differ by that person's income. The check cannot compare an opaque file; releasing both
    (a policy listing both, a publication including both) is refused, either alone is not."""
    _opaque(jobs_demo_db)
    _minus(jobs_demo_db)
    with pytest.raises(PolicyError, match="cannot compare it with"):
        _releasing(jobs_demo_db, "opaque", "minus")
    out = tmp_path / "release.duckdb"
    refused = sqlsdc_in_process("publish", jobs_demo_db, out, "--include", "opaque",
                                "--include", "minus")  # fmt: skip
    assert refused.returncode == 3, refused.stderr
    assert "cannot compare it with" in refused.stderr.replace("\n", " ")
    assert not out.exists()
    _releasing(jobs_demo_db, "opaque")


def _opaque(db) -> None:
    anonymize(db, user="admin", into="opaque", sql=OPAQUE, steps=["topcode:income:upper=1e9"])


def _minus(db) -> None:
    municipality, _region, _education, _income = _lonely(db)
    sql = ("SELECT region, sex, education, income FROM persons WHERE age >= 85 "
           f"AND municipality <> '{municipality}'")  # fmt: skip
    anonymize(db, user="admin", into="minus", sql=sql, steps=["topcode:income:upper=1e9"])


@pytest.mark.parametrize("first", ["opaque", "minus"])
def test_an_opaque_file_stored_next_to_a_released_file_of_its_table(jobs_demo_db, first):
    """The same two files, both listed under ``releases:`` before they are stored: the second
    is refused, whichever it is."""
    files = {"opaque": _opaque, "minus": _minus}
    _releasing(jobs_demo_db, "opaque", "minus")
    files[first](jobs_demo_db)
    with pytest.raises(MicrodataError, match="cannot compare"):
        files["minus" if first == "opaque" else "opaque"](jobs_demo_db)
