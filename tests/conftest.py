"""Shared fixtures: a small demo database built once per test session (real DuckDB file)."""

from __future__ import annotations

import atexit
import gc
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import cli_fork
import pytest

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy

DEMO_PERSONS = 20_000
DEMO_SEED = 7


def _without_cell_limits(shipped=demo_policy):
    """The demo policy without its ``cell_limits``: the session's shared databases take the
    queries of hundreds of tests, not one analyst's day (tests of the limits set their own,
    tests/security/test_redteam_s49i.py; the README replay runs the shipped policy)."""
    document = shipped().document_dict()
    document.pop("cell_limits", None)
    return load_policy(document, name="demo-policy.yaml")


sqlsdc.demo.build.demo_policy = demo_policy = _without_cell_limits  # before test modules import it


def pytest_configure(config):
    """Keep the order below under xdist: ``--dist loadfile`` would otherwise re-sort the files by
    their number of tests, and the long README replay (two tests) would start last."""
    if getattr(config.option, "loadscopereorder", False):
        config.option.loadscopereorder = False
    # The session's shared databases (demo_db) take the long statements of many test files
    # in a minute: the rate of long statements (sqlsdc.guard.statement_rate) is lifted here
    # and in the CLI's fork server (cli_fork.py), and its own tests set it back.
    from sqlsdc.guard import statement_rate

    statement_rate.CHARACTERS_PER_MINUTE = 2**62


def pytest_unconfigure(config):
    cli_fork.close()


def pytest_collection_modifyitems(items):
    """Files of only ``slow`` tests first, then files with some, then the others by their number
    of tests (a stable sort: the same order in every xdist worker).

    With ``--dist loadfile`` a worker runs whole files in this order; a long file started last
    keeps one worker busy while the other idles, so the long ones are handed out first.
    """
    slow, other, count = set(), set(), Counter(item.path for item in items)
    for item in items:
        (slow if item.get_closest_marker("slow") else other).add(item.path)
    items.sort(key=lambda item: (item.path not in slow, item.path in other, -count[item.path]))


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Collect with the cycle collector paused (imports make next to no cyclic garbage, yet
    it walked the growing heap 7 times while a worker collected: 1-2 s), then
    :func:`_freeze_the_survivors`; they are handed back at exit, to the interpreter's last
    collection (else DuckDB's bindings report them as leaked)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return (yield)
    finally:
        if enabled:
            gc.enable()
        _freeze_the_survivors()
        atexit.register(gc.unfreeze)


_FROZEN_BEFORE: list[Path | None] = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before each test file's first test (the last file's fixtures are gone by then),
    :func:`_freeze_the_survivors`."""
    if item.path != _FROZEN_BEFORE[0]:
        _FROZEN_BEFORE[0] = item.path
        _freeze_the_survivors()


def _freeze_the_survivors() -> None:
    """Exempt every object alive now from later full collections (:func:`gc.freeze`): what
    survives collection or a test file is modules, libraries, test items, session fixtures
    and caches, ~0.3-1 M objects that a full collection otherwise walks again and again.

    A worker made 20-26 full collections of 0.4-0.5 s each (the last five at the very end:
    pytest's search for unraisable exceptions), 9-11 s of CPU; with the survivors frozen,
    75-125 collections take 1.3-2.6 s, these calls included. Frozen objects are still freed by
    reference counting; what a test creates stays collectable until the next file starts.
    """
    gc.collect()
    gc.freeze()


def threshold_policy():
    """The demo policy with threshold protection everywhere (the guard's baseline tests)."""
    document = demo_policy().document_dict()
    document["protection"] = {
        "min_frequency": 10,
        "counts": {"method": "threshold"},
        "magnitudes": {"method": "threshold"},
    }
    for table in document["tables"].values():
        table.pop("protection", None)
        table.pop("dp", None)
    return load_policy(document, name="threshold-demo-policy")


ENTERPRISE_RULES = {"counts": ["freq:3"], "magnitudes": ["nk:1,60", "freq:3"]}


def suppress_document(**changes) -> dict:
    """The demo policy with suppression for enterprises (nace x region) and persons
    (geography hierarchy x sex)."""
    document = demo_policy().document_dict()
    enterprises = document["tables"]["enterprises"]
    rules = {**ENTERPRISE_RULES, **changes}
    enterprises["protection"] = {
        "counts": {"method": "suppress", "rules": rules["counts"]},
        "magnitudes": {"method": "suppress", "rules": rules["magnitudes"]},
    }
    enterprises["suppression"] = {"dimensions": ["nace", "region"], "time_limit": 10}
    persons = document["tables"]["persons"]
    persons["protection"] = {
        "counts": {"method": "suppress", "rules": ["freq:5"]},
        "magnitudes": {"method": "suppress", "rules": ["p:10", "freq:5"]},
    }
    persons["suppression"] = {"dimensions": ["geography", "sex"], "time_limit": 10}
    return document


def _copy_database(source: Path, folder: Path) -> Path:
    """A copy of the database file ``source`` as ``folder/demo.duckdb`` (its connections closed:
    everything is in the file, no write-ahead log beside it)."""
    assert not source.with_name(source.name + ".wal").exists(), f"{source} has a WAL"
    target = folder / "demo.duckdb"
    shutil.copy(source, target)
    return target


@pytest.fixture(scope="session")
def copy_database():
    """:func:`_copy_database`: a module prepares a database once, each test changes a copy."""
    return _copy_database


@pytest.fixture(scope="session")
def make_suppress_document():
    """:func:`suppress_document`, for tests that change its rules."""
    return suppress_document


@pytest.fixture(scope="session")
def suppress_template(tmp_path_factory):
    """A demo database whose enterprises and persons are protected by suppression; copy it."""
    path = tmp_path_factory.mktemp("suppress") / "template.duckdb"
    policy = load_policy(suppress_document(), name="suppress-demo")
    build_demo_database(path, persons=20_000, seed=7, policy=policy)
    return path


@pytest.fixture(scope="session")
def pristine_demo_db(tmp_path_factory) -> Path:
    """A demo database (20,000 persons, threshold protection) that no test opens: the
    template to copy."""
    path = tmp_path_factory.mktemp("pristine") / "demo.duckdb"
    build_demo_database(path, persons=DEMO_PERSONS, seed=DEMO_SEED, policy=threshold_policy())
    return path


@pytest.fixture(scope="session")
def rounded_template(pristine_demo_db, tmp_path_factory) -> Path:
    """The demo with counts rounded to 5 (unbiased) and magnitudes to 100 (conventional),
    minimum frequency 3, every table under these rules: the template that rounding tests copy
    (their queries write the audit and ledger)."""
    path = _copy_database(pristine_demo_db, tmp_path_factory.mktemp("rounded"))
    document = demo_policy().document_dict()
    document["protection"] = {
        "min_frequency": 3,
        "counts": {"method": "round", "base": 5, "rounding": "unbiased"},
        "magnitudes": {"method": "round", "base": 100, "rounding": "conventional"},
    }
    for table in document["tables"].values():
        table.pop("protection", None)
        table.pop("dp", None)
    sqlsdc.admin.apply(path, load_policy(document), "admin")
    return path


JOBS_SECRET = bytes(range(32))


@pytest.fixture(scope="session")
def jobs_template(pristine_demo_db, tmp_path_factory) -> Path:
    """:func:`pristine_demo_db` with a fixed PRF secret, that no test opens: the template of
    :func:`jobs_demo_db` (an opening, the update and the close cost ~60 ms, a copy ~2 ms)."""
    path = _copy_database(pristine_demo_db, tmp_path_factory.mktemp("jobs"))
    con = open_database(path)
    try:
        con.execute("UPDATE sqlsdc.secrets SET material = ? WHERE name = 'prf'", [JOBS_SECRET])
    finally:
        con.close()
    return path


@pytest.fixture()
def jobs_demo_db(jobs_template, tmp_path) -> Path:
    """A copy of :func:`pristine_demo_db` with a fixed PRF secret, for back-end jobs: they
    enlarge protection levels by factors drawn from it, and on this demo about one secret in
    four leaves no feasible CTA of the turnover table (the job then refuses, as it should), so
    their tests use one secret, to test the job and not the draw."""
    return _copy_database(jobs_template, tmp_path)


@pytest.fixture(scope="session")
def jobs_state(jobs_template, tmp_path_factory):
    """``jobs_state(build, tmp_path)``: a copy of :func:`jobs_demo_db` after ``build(path)``,
    built once per test process and copied for each test that asks for it.

    Red-team scenarios run the same first jobs (a file, two jobs, a policy applied) before the
    step each of them tests; each job costs 0.3-0.9 s of CPU, a copy ~2 ms. ``build`` is a
    module-level function (the cache's key): the copy holds exactly what running it on a fresh
    :func:`jobs_demo_db` leaves, closed, as the test would have had it."""
    templates: dict = {}

    def state(build, folder: Path) -> Path:
        if build not in templates:
            path = _copy_database(jobs_template, tmp_path_factory.mktemp("jobs-state"))
            build(path)
            templates[build] = path
        return _copy_database(templates[build], folder)

    return state


@pytest.fixture(scope="session")
def ckm_db(tmp_path_factory) -> Path:
    """A demo database with the demo policy as shipped (cell key method); read-only for tests."""
    path = tmp_path_factory.mktemp("ckm") / "demo.duckdb"
    build_demo_database(path, persons=DEMO_PERSONS, seed=DEMO_SEED)
    return path


def without_unit_noise(document: dict) -> dict:
    """A policy document with every magnitude rule's ``unit_noise`` removed (mutated)."""
    sections = [document.get("protection") or {}]
    sections += [t.get("protection") or {} for t in document.get("tables", {}).values()]
    for protection in sections:
        if isinstance(protection.get("magnitudes"), dict):
            protection["magnitudes"].pop("unit_noise", None)
    return document


@pytest.fixture(scope="session")
def ckm_pinned_db(tmp_path_factory) -> Path:
    """The CKM demo without the permanent unit noise on magnitudes: for the tests of the
    mean floor and μ_c on *pinned* values (``SUM(age) ... WHERE age = 94``), whose reasoning
    needs every contribution to be the pinned value (the unit factors blur it, s45a);
    read-only for tests."""
    path = tmp_path_factory.mktemp("ckm-pinned") / "demo.duckdb"
    document = without_unit_noise(demo_policy().document_dict())
    policy = load_policy(document, name="demo-policy-without-unit-noise")
    build_demo_database(path, persons=DEMO_PERSONS, seed=DEMO_SEED, policy=policy)
    return path


@pytest.fixture(scope="session")
def demo_db(pristine_demo_db, tmp_path_factory) -> Path:
    """The demo database shared by the whole session: tests must not change its data or policy
    (queries add audit and ledger entries; use ``fresh_demo_db`` to inspect those)."""
    return _copy_database(pristine_demo_db, tmp_path_factory.mktemp("demo"))


@pytest.fixture
def fresh_demo_db(pristine_demo_db, tmp_path) -> Path:
    """A private, untouched copy of the demo database that a test may change."""
    copy = tmp_path / "demo.duckdb"
    shutil.copy(pristine_demo_db, copy)
    return copy


@pytest.fixture
def analyst(demo_db):
    """A guarded connection to the shared demo database as user ``analyst``."""
    con = sqlsdc.connect(demo_db, user="analyst")
    yield con
    con.close()


@pytest.fixture(scope="module")
def module_analyst(demo_db):
    """One guarded connection as ``analyst`` for a whole module: for modules of statements that
    are refused before they run or only read, so that none changes what the next one sees.
    Opening and closing a connection per test was most of such a module's time."""
    con = sqlsdc.connect(demo_db, user="analyst")
    yield con
    con.close()


@pytest.fixture
def session_catalog(analyst):
    """The server's catalog of an analyst's session (sqlsdc.server.catalog)."""
    from sqlsdc.server.catalog import SessionCatalog

    catalog = SessionCatalog(analyst)
    yield catalog
    catalog.close()


@pytest.fixture
def raw(demo_db):
    """An unguarded DuckDB connection to the demo data, for computing expected values.

    It uses sqlsdc's own connection settings, because DuckDB shares one instance per file and
    process and refuses a second, different configuration.
    """
    con = open_database(demo_db)
    yield con
    con.close()


@pytest.fixture(scope="module")
def ckm(ckm_db):
    """A guarded connection to the CKM demo database as user ``analyst``."""
    con = sqlsdc.connect(ckm_db, user="analyst")
    yield con
    con.close()


@pytest.fixture(scope="module")
def raw_ckm(ckm_db, ckm):
    """Unguarded access to the CKM demo data (opened after ``ckm``: same DuckDB instance)."""
    con = open_database(ckm_db)
    yield con
    con.close()


@pytest.fixture(scope="module")
def released(suppress_template, tmp_path_factory):
    """A release of the suppression demo (a job output, the suppression patterns and a guarded
    query), with its Parquet copy in ``parquet/`` beside it: (db, release file, report)."""
    from sqlsdc.jobs.protect import protect_query
    from sqlsdc.release import publish

    folder = tmp_path_factory.mktemp("release")
    db = folder / "demo.duckdb"
    shutil.copy(suppress_template, db)
    protect_query(db, "admin", "SELECT sex, education, COUNT(*) FROM persons WHERE age >= 90 "
                  "GROUP BY sex, education", into="old_people")  # fmt: skip
    query = (
        "SELECT region, sex, COUNT(*) AS n, AVG(income) AS mean_income FROM persons GROUP BY ALL"
    )
    out = folder / "release.duckdb"
    report = publish(db, out, "admin", queries={"persons_by_region": query}, analyst="analyst",
                     parquet=folder / "parquet")  # fmt: skip
    return db, out, report


@pytest.fixture(scope="session")
def sqlsdc_in_process():
    """``sqlsdc ARGS`` run in this process by click's runner, as a ``CompletedProcess``.

    For CLI calls whose assertions do not need a process of their own (a process start and the
    imports cost about a second): each command keeps real-subprocess tests too. Exceptions are not
    caught, so a traceback that would reach a user fails the test.
    """
    from click.testing import CliRunner
    from sqlsdc.cli.main import cli

    def run(*args, input=None):
        argv = [str(a) for a in args]
        result = CliRunner().invoke(cli, argv, input=input, catch_exceptions=False)
        return subprocess.CompletedProcess(argv, result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture(scope="module")
def server(server_db):
    """A sqlsdc server (``tests/server/conftest.py``) over the ``server_db`` of the module or
    folder that asks for it, for the module's tests."""
    from tests.server.conftest import start_server, stop_server

    running = start_server(server_db, "--insecure", "--statement-timeout", "20")
    yield running
    stop_server(running)
