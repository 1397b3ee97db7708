"""The release database: every protected output, and nothing else, for BI tools to read.

``publish`` writes a new DuckDB file holding plain tables only: the outputs of protection jobs
(``protected.*``, registered in ``sqlsdc.outputs``), the suppression pattern of every table
protected by suppression in the query path, and the results of named guarded queries.
Record-level outputs (synthetic and anonymised files) are published only when released on
purpose — listed under the policy's ``releases:`` or named in ``include`` — because an admin
stores several candidates of one file to compare them, and two versions of the same records
side by side undo each other's protection. It holds
no confidential table, no internal ``__`` column, no ledger, no key and no secret, and needs no
Python UDF, so any DuckDB client — the CLI, SQLAlchemy's ``duckdb_engine`` (Superset, Metabase
drivers), R, a notebook — can open it read-only in another process. A table ``release_contents``
says where every table came from. The file is written in the storage format of DuckDB
``storage_version`` (default v1.0.0, so DuckDB 1.x readers open it too: see
:mod:`sqlsdc.engines.release_storage`), and with ``parquet`` also as Parquet files with a
manifest (:mod:`sqlsdc.release_parquet`).

Example:
    >>> publish("sqlsdc-demo.duckdb", "release.duckdb", "admin",  # doctest: +SKIP
    ...         queries={"persons_by_region": "SELECT region, COUNT(*) AS n FROM persons "
    ...                                       "GROUP BY region"}, analyst="analyst")
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sqlsdc import release_parquet
from sqlsdc.catalog import store
from sqlsdc.catalog.store import pattern_table, require_admin
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema, duckdb_sql
from sqlsdc.engines.duckdb_replace import drop_old_wal, hold_for_replacing
from sqlsdc.engines.release_storage import OLDEST_READER, ReleaseFile, storage_version
from sqlsdc.errors import Error, NotFoundError, OperationalError, PolicyViolation
from sqlsdc.files import check_replaceable, check_writable
from sqlsdc.guard.connection import connect
from sqlsdc.guard.postprocess import without_dictionaries
from sqlsdc.guard.releases import dp_table_read
from sqlsdc.jobs.file_pairs import (
    held_files,
    refuse_file_pairs,
    refuse_opaque_files,
    released_files,
)
from sqlsdc.jobs.patterns import ensure_patterns
from sqlsdc.policy import load_policy
from sqlsdc.release_private import claim, let_go, private_folder, remove_private
from sqlsdc.tabular.universe import STATUS, VALUE, universe_of

CONTENTS = "release_contents"
MICRODATA = ("anonymize", "synthesize")  # job methods whose outputs hold records
SIDE_FILES = (".wal", ".lock", ".waiting")  # beside the database: DuckDB's and file_lock's
# How long a publication waits for the processes that have OUT open read-write before it
# replaces OUT (as any opening of a database waits)
REPLACE_WAIT_SECONDS = engine.LOCK_WAIT_SECONDS


@dataclass(frozen=True)
class Published:
    table: str
    source: str  # job | suppression | query
    method: str
    rows: int
    definition: str  # the job's or query's SQL, or the suppression universe


@dataclass(frozen=True)
class Withheld:
    """A record-level output not published: neither under ``releases:`` nor included."""

    table: str
    method: str  # synthesize | anonymize


@dataclass(frozen=True)
class PublishReport:
    path: str
    policy_version: int
    tables: tuple[Published, ...]
    storage_version: str = OLDEST_READER
    parquet: str | None = None  # the folder of Parquet files and manifest.json, if written
    release_id: int | None = None  # the publication's audit entry (the ledger's query id)
    withheld: tuple[Withheld, ...] = ()  # record-level outputs neither released nor included

    def to_dict(self) -> dict:
        return {**asdict(self), "tables": [asdict(t) for t in self.tables],
                "withheld": [asdict(w) for w in self.withheld]}  # fmt: skip


def publish(
    db: str | Path,
    out: str | Path,
    user: str,
    *,
    queries: Mapping[str, str] | None = None,
    analyst: str | None = None,
    include: Sequence[str] = (),
    replace: bool = False,
    storage: str = OLDEST_READER,
    parquet: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> PublishReport:
    """Write the release database ``out`` from the protected outputs of ``db`` (admins only).

    ``queries`` maps table names to SQL run through a guarded connection as ``analyst`` (default:
    ``user``), audited and recorded in the ledger like any query; their protected values are
    stored. The file is written next to ``out`` and moved into place only when complete.

    Every table output of ``sqlsdc protect`` is published. A record-level output (method
    ``synthesize`` or ``anonymize``) is published only if the policy lists it under
    ``releases:`` or ``include`` names it; the others are reported as ``withheld``.

    ``storage`` is the oldest DuckDB release that must open ``out`` (``v1.0.0`` by default, or
    ``latest``; :func:`~sqlsdc.engines.release_storage.storage_version`); types that release
    does not know are stored as ones it does (:data:`~sqlsdc.engines.release_storage.NEWER_TYPES`).
    With ``parquet``, the same tables are also written to that folder as Parquet files with a
    ``manifest.json`` (:func:`~sqlsdc.release_parquet.write_parquet`), also moved into place
    only when complete.

    The publication is a release of its own: one audit entry (``refused``, ``failed`` or
    ``accepted``) and, with the accepted entry in one transaction, a ledger row for every cell
    of every released table (:func:`_record`) — written before the file is moved into place, so
    that no release exists that the ledger does not hold.

    Raises:
        AccessDenied: ``user`` is not an admin of the policy in force.
        Error: ``out`` or ``parquet`` exists (without ``replace``) or ``out`` is the database
            itself, a name is not a plain identifier or is used twice, ``storage`` is unknown;
            PolicyViolation when a query is refused.
        NotFoundError: a name in ``include`` is not a stored synthetic or anonymised output.
    """
    out, db = Path(out), Path(db)
    folder = None if parquet is None else Path(parquet)
    queries = dict(queries or {})
    say = progress or (lambda _message: None)
    included = tuple(dict.fromkeys(name.lower() for name in include))
    request = json.dumps({"publish": str(out), "queries": queries, "as": analyst or user,
                          **({"include": list(included)} if included else {})})  # fmt: skip
    fingerprint = hashlib.sha256(request.encode()).hexdigest()[:16]
    query_id, version = _open_entry(db)

    def audit(decision: str, error: BaseException) -> None:
        with _catalog(db) as con:
            if store.has_outcome(con, query_id):  # recorded just before an interrupt: it stands
                return
            store.record_query(
                con,
                query_id,
                user,
                version,
                decision,
                request,
                reason=store.audit_reason(error),
                fingerprint=fingerprint,
            )

    try:
        storage = storage_version(storage)
        _check_request(db, out, folder, queries, replace)
        with _catalog(db) as con:
            checked_version, policy = _admin_policy(con, user)
            outputs = _job_outputs(con)
            _check_included(outputs, included)
            released = _released_outputs(outputs, policy.releases, included)[0]
            _check_dp_sources(con, policy, released)
            _check_file_pairs(con, policy, released)
    except Error as refusal:
        audit("refused", refusal)
        raise
    except BaseException as failure:  # Ctrl-C in the checks, which read the catalog: no
        audit("failed", failure)  # entry was left (new user s46i, tests/test_release.py)
        raise
    lock = out.with_name(out.name + ".lock")  # sqlsdc's lock file, which holding OUT leaves
    locked_before = lock.exists()
    try:  # before anything is charged or recorded: OUT open read-write elsewhere is waited for
        held = hold_for_replacing(out, REPLACE_WAIT_SECONDS)
    except BaseException as failure:  # ... or the publication fails (exit code 9)
        audit("failed", failure)
        raise
    try:
        return _write_release(db, out, folder, user, queries, analyst, included, request,
                              fingerprint, query_id, storage, (checked_version, released),
                              audit, say)  # fmt: skip
    finally:
        if held is not None:
            held.close()
            if not locked_before:  # a release is its file alone (tests/test_release_readers.py)
                lock.unlink(missing_ok=True)


def _write_release(db, out, folder, user, queries, analyst, included, request, fingerprint,
                   query_id, storage, checked, audit, say) -> PublishReport:  # fmt: skip
    """Collect, write, record and put in place the release (:func:`publish` after its checks)."""
    # one partial file (and folder) per publication, named by its audit entry: publications to
    # one OUT at once never write, move or delete each other's half-written files. Each is
    # written inside a folder only this user can open: one left by a publication killed before
    # it was recorded (kill -9, power loss) is a release the ledger and audit never held, and
    # it sat beside OUT readable by every reader of the release folder (red team s48g); the
    # folders such publications left are removed here (:mod:`sqlsdc.release_private`)
    private = private_folder(out, query_id)
    partial = private / out.name
    private_pq = None if folder is None else private_folder(folder, query_id)
    partial_folder = None if private_pq is None else private_pq / folder.name
    recorded, held, claimed = False, [], False
    try:
        with _catalog(db):  # the database's lock: no publication between making and locking
            held = claim([out] if folder is None else [out, folder], query_id)
            claimed = True  # the folders are this publication's (claim removes its own if not)
        version, tables, withheld = _collect(db, user, queries, analyst, included, checked, say)
        _write(partial, version, tables, storage, say)
        if partial_folder is not None:
            say(f"writing Parquet files into {folder}")
            release_parquet.write_parquet(partial_folder, tables, release_id=query_id,
                                          policy_version=version)  # fmt: skip
        say("recording the release")
        with _catalog(db) as con:
            _record(con, tables, query_id, user, version, request, fingerprint)
            recorded = True
        drop_old_wal(out)  # a killed writer's: it would meet the new file
        partial.replace(out)
        if partial_folder is not None:
            release_parquet.put_in_place(partial_folder, folder)
    except BaseException as failure:
        if claimed:  # else a folder of this name is another publication's (red team s48q)
            remove_private(private)
            if private_pq is not None:
                remove_private(private_pq)
        let_go(held)
        if not recorded:  # else its accepted entry stands, with every cell in the ledger
            audit("refused" if isinstance(failure, PolicyViolation) else "failed", failure)
        told = engine.write_failure(failure)  # a full disk is no bug
        if told is failure:
            raise
        raise told from None
    remove_private(private)
    if private_pq is not None:
        remove_private(private_pq)
    let_go(held)
    entries = tuple(entry for _d, entry, _r in tables.values())
    return PublishReport(str(out), version, entries, storage,
                         None if folder is None else str(folder), query_id, withheld)  # fmt: skip


def _open_entry(db: Path) -> tuple[int, int]:
    """A query id for the publication's audit entry, and the policy version in force."""
    with _catalog(db) as con:
        current = store.current_policy(con)
        if current is None:
            raise store.no_catalog(db, con)
        return store.next_query_id(con), current[0]


@contextmanager
def _catalog(db: Path):
    con = engine.open_database(db)
    try:
        yield con
    finally:
        con.close()


def _check_request(db: Path, out: Path, folder: Path | None, queries: dict, replace: bool) -> None:
    if out.resolve() == db.resolve():
        raise Error("the release database must be another file than the confidential one")
    beside = {db.resolve().with_name(db.resolve().name + end) for end in SIDE_FILES}
    for target in (out, folder):  # DuckDB deletes a stray WAL; a new lock file lets two write
        if target is not None and target.resolve() in beside:
            raise Error(
                f"{target} is a file kept beside the database {db.name} (its write-ahead log, "
                "lock or waiting list); name another"
            )
    check_replaceable(out)
    for target in (out, folder):
        if target is not None and target.exists() and not replace:
            raise Error(f"{target} exists; pass --force (or --replace) to overwrite it")
        if target is not None and not target.parent.is_dir():  # before any query is charged
            raise NotFoundError(f"cannot write {target}: folder {target.parent} does not exist")
        if target is not None:  # a folder that takes no file: found before any charge
            check_writable(target)
    if folder is not None and (
        folder.is_file() or folder.resolve() in (db.resolve(), out.resolve())
    ):
        raise Error(f"--parquet {folder} must be a folder, not a file; name a new folder")
    if folder is not None and folder.exists():  # replaced as a whole: an earlier release only
        release_parquet.check_replaceable(folder)
    seen: dict[str, str] = {}
    for name in queries:
        if not name.isidentifier() or name.startswith("__") or name.casefold() == CONTENTS:
            raise Error(f"release table name {name!r} must be a plain name (letters, digits, _)")
        if name.casefold() in seen:
            raise Error(_same_name(seen[name.casefold()], name))
        seen[name.casefold()] = name


def _same_name(first: str, second: str) -> str:
    """Table names are case-insensitive in DuckDB (and in most BI tools)."""
    return (
        f"two outputs would be published as {first!r} and {second!r}, which differ only in "
        "case and name the same table; rename one"
    )


def _collect(
    db: Path, user: str, queries: dict, analyst, included: tuple[str, ...], checked, say
) -> tuple[int, dict, tuple[str, ...]]:
    """Every table to release, ``name -> (data, Published, how to record its cells)``, and the
    record-level outputs withheld. ``checked``: the policy version and the outputs the checks
    before passed; a policy applied or an output stored or replaced by another process since
    then (the checks and this read are two openings of the file) stops the publication, which
    would release what no check saw (red team s39b)."""
    tables: dict[str, tuple[pa.Table, Published, Recorder]] = {}
    with _catalog(db) as source:
        version, policy = _admin_policy(source, user)
        outputs, withheld = _released_outputs(_job_outputs(source), policy.releases, included)
        if (version, outputs) != checked:
            raise OperationalError(
                "the policy or the stored outputs changed while this publication was being "
                "checked (another admin's command): nothing was published; run `sqlsdc publish` "
                "again"
            )
        for name, method, sql, job_id in outputs:
            say(f"job output {name}")
            data = _clean(source.sql(f"SELECT * FROM {name}").to_arrow_table())
            entry = Published(name.split(".")[-1], "job", method, 0, sql)
            _add(tables, _released_job(data), entry, _copied(job_id, name))
        suppressed = [t.name for t in policy.confidential_tables if t.suppression is not None]
        if suppressed:
            say(f"suppression patterns of {', '.join(suppressed)}")
            source.execute("BEGIN TRANSACTION")
            ensure_patterns(source, policy, version, suppressed)
            source.execute("COMMIT")
        for table in suppressed:
            universe = universe_of(policy, table)
            pattern = _released_pattern(source, universe)
            definition = f"suppression of {table} over {', '.join(universe.columns)}"
            entry = Published(f"suppressed_{table}", "suppression", "suppress", 0, definition)
            _add(tables, pattern, entry, _pattern_cells(universe))
    taken = {name.casefold(): name for name in tables}
    clashes = [(taken[n.casefold()], n) for n in queries if n.casefold() in taken]
    if clashes:  # refused before any query runs (and is charged)
        raise Error(_same_name(*clashes[0]))
    if queries:
        with connect(db, analyst or user) as guarded:
            for name, sql in queries.items():
                say(f"query {name}")
                cursor = guarded.execute(sql)
                mechanisms = sorted({c.mechanism for c in cursor.query.columns if c.released})
                entry = Published(name, "query", "+".join(mechanisms) or "public", 0, sql)
                _add(tables, _clean(cursor.arrow()), entry, _copied(cursor.query_id, name))
    return version, tables, withheld


def _check_included(outputs: list, included: tuple[str, ...]) -> None:
    """Every name in ``included`` is a stored record-level output (checked before any query
    runs or is charged)."""
    microdata = {name.split(".")[-1].lower() for name, method, *_ in outputs if method in MICRODATA}
    unknown = [name for name in included if name not in microdata]
    if unknown:
        raise NotFoundError(
            f"--include {unknown[0]}: no synthetic or anonymised output of that name is stored "
            f"(stored: {', '.join(sorted(microdata)) or 'none'})"
        )


def _check_dp_sources(con, policy, outputs: list) -> None:
    """Refuse to publish an output of a job that was not differentially private over a table
    the policy in force protects by DP (checked before any query runs or is charged). The
    jobs refuse such tables, but a policy may have put a table under DP after its jobs ran:
    their suppressed, rounded, anonymised or synthetic copies of it, published, would release
    its data outside the privacy budget (red team s36d)."""
    for name, method, sql, _job in outputs:
        ((report,),) = con.execute("SELECT report FROM sqlsdc.outputs WHERE name = ?",
                                   [name]).fetchall()  # fmt: skip
        private = dp_table_read(policy, method, sql, report)
        if private:
            raise PolicyViolation(
                f"{name} ({method}) holds data of {private}, which the policy in force "
                "protects by differential privacy: publishing it would release that data "
                "outside the privacy budget",
                f"drop {name}, or protect {private} by its former method again",
            )


def _check_file_pairs(con, policy, outputs: list) -> None:
    """Refuse a publication holding two anonymised files of one table that differ by a few
    units in a cell (checked before any query runs or is charged): the candidates an admin
    stores to compare are not compared with each other until they are released together
    (:mod:`sqlsdc.jobs.file_pairs`)."""
    names = [name.split(".")[-1] for name, method, *_ in outputs if method == "anonymize"]
    held = held_files(con, policy) if names else []  # earlier versions readers keep
    if len(names) > 1 or held:
        refuse_opaque_files(con, policy, names, _pair_refusal)
        refuse_file_pairs(con, policy, released_files(con, policy, names),
                          refusal=_pair_refusal, held=held)  # fmt: skip


def _pair_refusal(first: str, second: str, reason: str) -> PolicyViolation:
    return PolicyViolation(
        f"the publication would hold {first} and {second}, anonymised files of one table "
        f"that cannot both be released: {reason}",
        "Publish one of them: leave the other out of releases: and --include",
    )


def _released_outputs(outputs: list, releases: tuple[str, ...], included: tuple[str, ...]):
    """The job outputs to publish, and the record-level ones withheld."""
    chosen = {*releases, *included}
    kept, withheld = [], []
    for output in outputs:
        name, method = output[0].split(".")[-1], output[1]
        if method in MICRODATA and name.lower() not in chosen:
            withheld.append(Withheld(name, method))
        else:
            kept.append(output)
    return kept, tuple(withheld)


Recorder = Callable[..., None]  # (con, data, query_id=, user=, fingerprint=) -> None


def _copied(source_query_id: int | None, name: str) -> Recorder:
    """Record a table whose cells the ledger holds already (a job's, a guarded query's) again,
    with the same identities, under the publication."""

    def record(con, _data, *, query_id, user, fingerprint) -> None:
        if source_query_id is None:
            raise Error(
                f"{name} was stored before jobs were recorded in the ledger; run its job again "
                "(sqlsdc protect ... --replace) to publish it"
            )
        store.copy_release(con, source_query_id, query_id=query_id, user=user,
                           fingerprint=fingerprint)  # fmt: skip

    return record


def _pattern_cells(universe) -> Recorder:
    """Record every cell of a released suppression pattern, per aggregate, with its status."""

    def record(con, data, *, query_id, user, fingerprint) -> None:
        for aggregate in universe.aggregates:
            cells = data.select([*universe.columns, aggregate, f"{aggregate}_status"])
            store.record_cells(con, cells, tables=(universe.table,), keys=universe.columns,
                               values=(aggregate,), mechanism="suppress",
                               status=f"{aggregate}_status", query_id=query_id, user=user,
                               fingerprint=fingerprint)  # fmt: skip

    return record


def _record(con, tables: dict, query_id: int, user: str, version: int, request: str,
            fingerprint: str) -> None:  # fmt: skip
    """The publication's audit entry and the ledger rows of every released cell: one
    transaction, so that either both are there or neither."""
    con.execute("BEGIN TRANSACTION")
    try:
        for data, _entry, record in tables.values():
            record(con, data, query_id=query_id, user=user, fingerprint=fingerprint)
        rows = sum(entry.rows for _data, entry, _record in tables.values())
        store.record_query(con, query_id, user, version, "accepted", request,
                           fingerprint=fingerprint, rows=rows)  # fmt: skip
        con.execute("COMMIT")
    except BaseException:
        engine.rollback(con)
        raise


def _admin_policy(con, user: str):
    version, document, source = require_admin(con, user)
    return version, load_policy(document, name=source)


def _job_outputs(con) -> list[tuple[str, str, str, int | None]]:
    """``(schema.name, method, sql, query id)`` of every registered job output that still
    exists (the query id of its job's audit entry; NULL for outputs older than that)."""
    job_id = (
        "query_id"
        if "query_id" in duckdb_schema.table_columns(con, "sqlsdc", "outputs")
        else "NULL"
    )
    rows = con.sql(
        f"SELECT name, method, sql_text, {job_id} FROM sqlsdc.outputs ORDER BY name"
    ).fetchall()
    existing = {
        f"{s}.{t}" for s, t in con.sql("SELECT schema_name, table_name FROM duckdb_tables()")
        .fetchall()
    }  # fmt: skip
    return [r for r in rows if r[0] in existing]


def _released_pattern(con, universe) -> pa.Table:
    """The pattern as a release shows it: codes (NULL at totals), values, published/suppressed.

    Contributor counts are left out (they would reveal suppressed counts), and so is the
    distinction between primary and secondary cells (it tells which cells are sensitive).
    """
    columns = [exp.column(c) for c in universe.columns]
    for aggregate in universe.aggregates:
        columns.append(exp.alias_(exp.column(f"{aggregate}{VALUE}"), aggregate))
        published = exp.EQ(this=exp.column(f"{aggregate}{STATUS}"),
                           expression=exp.Literal.string("published"))  # fmt: skip
        status = exp.Case(ifs=[exp.If(this=published, true=exp.Literal.string("published"))],
                          default=exp.Literal.string("suppressed"))  # fmt: skip
        columns.append(exp.alias_(status, f"{aggregate}_status"))
    codes = [exp.column(c) for c in universe.columns]
    select = exp.select(*columns).from_(pattern_table(universe.table))
    select = select.order_by(exp.column("__level"), *codes)
    return without_dictionaries(con.sql(duckdb_sql.to_sql(select)).to_arrow_table())


def _released_job(table: pa.Table) -> pa.Table:
    """A job output as a release shows it: a suppression job's ``status`` becomes published or
    suppressed, and the ``rule`` that fired is left out; both would tell which cells are
    sensitive (primary) and why (e.g. fewer than 3 units), which the pattern hides."""
    if "status" in table.column_names:
        published = pc.equal(table["status"], "published")
        status = pc.if_else(published, "published", "suppressed")
        table = table.set_column(table.column_names.index("status"), "status", status)
    if "rule" in table.column_names:
        table = table.drop_columns(["rule"])
    return table


def _clean(table: pa.Table) -> pa.Table:
    """Internal columns (``__...``, e.g. hidden statuses) never leave, nor a dictionary of
    values: DuckDB gives an ENUM column (an anonymised or synthetic file keeps its source's)
    as a dictionary of all the type's labels, which the Parquet file and its pandas
    categories kept, those of units outside the file or blanked in it included (red team
    s49a: a file of section A firms listed three sizes held by one firm each elsewhere)."""
    keep = [i for i, name in enumerate(table.column_names) if not name.startswith("__")]
    return without_dictionaries(table.select(keep))


def _add(tables: dict, data: pa.Table, entry: Published, record: Recorder) -> None:
    taken = {name.casefold(): name for name in [*tables, CONTENTS]}
    if entry.table.casefold() in taken:
        raise Error(_same_name(taken[entry.table.casefold()], entry.table))
    tables[entry.table] = (data, Published(**{**asdict(entry), "rows": data.num_rows}), record)


def _write(partial: Path, version: int, tables: dict, storage: str, say) -> None:
    """Write the release into ``partial`` in DuckDB ``storage`` format (the caller moves it into
    place once recorded)."""
    with ReleaseFile(partial, storage) as release:
        for name, (data, _entry, _record) in tables.items():
            say(f"writing {name}")
            release.write(name, data)
        entries = [entry for _data, entry, _record in tables.values()]
        contents = pa.table({
            "table_name": [e.table for e in entries],
            "source": [e.source for e in entries],
            "method": [e.method for e in entries],
            "rows": pa.array([e.rows for e in entries], pa.int64()),
            "definition": [e.definition for e in entries],
            "policy_version": pa.array([version] * len(entries), pa.int32()),
        })  # fmt: skip
        release.write(CONTENTS, contents)
