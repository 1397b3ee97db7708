"""The differencing checks' statements are built without needless work (session 50, s50f).

sqlglot's builders copy the query they extend unless told ``copy=False``: a chain of them over
nested subqueries copied each inner query at every step out, and ``Select.join(...,
join_type="inner")`` parses ``FROM _ INNER JOIN _`` at each call. Job and red-team tests
spend their time in these checks (a quick run's 40 costliest files are mostly job
scenarios); the same statements (compared on recorded inputs) are now built without them:
198 union queries of three test files in 1.0-1.2 s of CPU instead of 3.4-3.8 s
(``benchmarks/README.md``, session 50)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import sqlglot.parser
from sqlglot import exp

from sqlsdc.jobs import cell_unions, isolated_groups, uncovered


@pytest.fixture
def query_copies(monkeypatch) -> list[str]:
    """The kind of every query (SELECT, UNION, ...) copied while the test runs."""
    copies: list[str] = []
    copy = exp.Expression.copy

    def counted(self):
        if isinstance(self, exp.Query):
            copies.append(self.key)
        return copy(self)

    monkeypatch.setattr(exp.Expression, "copy", counted)
    return copies


@pytest.fixture
def parsed(monkeypatch) -> list[str]:
    """The SQL texts parsed while the test runs (as statements or into a node type)."""
    texts: list[str] = []
    parse, parse_into = sqlglot.parser.Parser.parse, sqlglot.parser.Parser.parse_into

    def recorded(self, raw_tokens, sql=None):
        texts.append(sql or "")
        return parse(self, raw_tokens, sql)

    def recorded_into(self, expression_types, raw_tokens, sql=None):
        texts.append(sql or "")
        return parse_into(self, expression_types, raw_tokens, sql)

    monkeypatch.setattr(sqlglot.parser.Parser, "parse", recorded)
    monkeypatch.setattr(sqlglot.parser.Parser, "parse_into", recorded_into)
    return texts


def _spec(measure=None, where=None):
    return SimpleNamespace(unit="u", table="t", measure=measure, where=where, dims=("a", "v"),
                           unit_noise=None)  # fmt: skip


@pytest.mark.parametrize("additive", [False, True])
@pytest.mark.parametrize("measure", [None, "x"])
def test_a_union_query_copies_no_query_it_uses_once(query_copies, measure, additive):
    cells = _spec(measure, exp.column("age") >= 3)
    inner = _spec(measure, exp.column("age") < 7)
    keys = [exp.column("a"), exp.column("v")]
    query = cell_unions._union_query(cells, inner, keys, [exp.column("w")], additive=additive)
    assert query_copies == []
    # the rows of both populations (r) and the inner cells' (whole) are read once each...
    sql = query.sql("duckdb").upper()
    assert sql.count("HASH(") == 2
    assert sql.count("GROUPING(") == 1
    query_copies.clear()
    # ...and where a shared cell does not count, read again: copied for each use but the last
    shared = cell_unions._union_query(cells, inner, keys, [exp.column("w")], False)
    assert len(query_copies) == 3
    assert shared.sql("duckdb").upper().count("HASH(") == 2 + 1 + 2  # r twice, whole three times


def test_the_uncovered_statement_parses_no_join_and_no_name_of_its_own(parsed):
    spec = _spec("x")
    cut = (exp.column("age") >= 3, [("a", exp.column("a")), ("v", exp.column("v"))], False)
    cover = (exp.column("age") < 7, [("w", exp.column("w"))], True)
    for top_k in (0, 2):
        sql = uncovered._statement(spec, cut, cover, 3, top_k).sql("duckdb")
        assert sql.count(" JOIN ") == 10 + (top_k > 0)
    # only the job's table (as the job names it) and the one row wanted; no join type, no
    # name of a common table expression (``__hits``, ``__r``, ...)
    assert sorted(parsed) == ["FROM t", "FROM t", "LIMIT 1"]


class Engine:
    """A connection that answers every statement with ``rows`` and keeps the last one."""

    def __init__(self, rows):
        self.rows, self.sql = rows, None

    def execute(self, sql):
        self.sql = sql
        return self

    def fetchall(self):
        return self.rows


def test_the_uncovered_check_copies_no_query(query_copies, monkeypatch):
    monkeypatch.setattr(uncovered, "_additive", lambda *args: False)
    engine = Engine([(1, "p", "x", 0, 2)])
    cut = (exp.column("age") >= 3, [("a", exp.column("a")), ("v", exp.column("v"))], False)
    cover = (exp.column("age") < 7, [("w", exp.column("w"))], True)
    assert uncovered._uncovered(engine, _spec(), cut, cover, 3) == ({"a": "p", "v": None}, 2, "b")
    assert query_copies == []
    assert engine.sql.upper().count(" JOIN ") == 10


def test_a_union_check_copies_no_query(query_copies, monkeypatch):
    monkeypatch.setattr(cell_unions, "_additive", lambda *args: True)
    engine = Engine([(1,)])
    cells, inner = _spec(where=exp.column("age") >= 3), _spec(where=exp.column("age") < 7)
    assert cell_unions.cells_add_up(engine, cells, inner)
    assert query_copies == []
    assert engine.sql.upper().count("GROUPING(") == 1


def test_the_venn_regions_copy_no_query(query_copies):
    spec = _spec("x")
    engine = Engine([("p", "011", 4)])
    wheres = [exp.column("age") >= 3, exp.column("age") < 7, None]
    assert isolated_groups.venn_regions(engine, spec, ["a"], wheres) == {("p",): {6: 4}}
    assert query_copies == []  # not even for the generator: it is written once
    assert engine.sql.count("COALESCE(age >= 3, FALSE)") == 2  # a flag and the WHERE
