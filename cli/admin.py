"""Administration commands: ``init``, ``policy validate|show|apply``, ``audit``, ``outputs``,
``rekey``, ``risk``."""

from __future__ import annotations

import contextlib
import functools
import sys
from datetime import datetime
from pathlib import Path

import click
from sqlsdc.cli.output import (
    CommandFirst,
    ExistingFile,
    NamedPath,
    StatementCommand,
    format_option,
    print_frame,
    print_json,
    read_sql,
)

_TIMES = ["%Y-%m-%d", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]  # --since
MAX_LIMIT = 1_000_000  # audit rows shown; 10**20 overflowed the engine as a bug in sqlsdc


OPENED = "sqlsdc.opened"
"""``ctx.meta`` key of the connection :func:`acting_admin` opened to find the acting admin,
which the command answers from (:func:`opened`): read-only for a command that only reads,
read-write for one that writes."""


def acting_admin_option(*decls: str, reads: bool = False, writes: bool = False,
                        confirmed_by: str | None = None):  # fmt: skip
    """The acting administrator's option, spelled as ``decls`` (option names and the parameter's
    name), resolved by :func:`acting_admin` in every command that takes it. ``reads``: the
    command only reads the database, and answers from the connection opened to find the
    admin (:func:`opened`) rather than opening the file a second time (~30 ms of CPU).
    ``writes``: the command writes, from a read-write connection opened to find the admin,
    unless it asks for a confirmation first (``confirmed_by``: the flag that skips the
    question, ``yes``): the file is not held while an admin reads the question."""
    older = [n for n in decls if n.startswith("--") and n != "--as"]
    return click.option(
        *decls,
        default=None,
        callback=functools.partial(
            acting_admin, reads=reads, writes=writes, confirmed_by=confirmed_by
        ),  # fmt: skip
        metavar="ADMIN",
        help="Acting administrator (role admin in the policy in force; for `init` of a new "
        "database, in the new policy). Default: that policy's only admin; with several, "
        f"required. Older spellings: {', '.join(older)}.",
    )


def acting_admin(
    ctx: click.Context,
    _param,
    name: str | None,
    *,
    reads: bool = False,
    writes: bool = False,
    confirmed_by: str | None = None,
) -> str | None:
    """The admin named with ``--as``, else the only admin of the policy in force (of the policy
    file given to ``init`` on a database without the catalog). It was ``admin`` whatever the
    policy said: a policy whose only admin is ``chief`` needed ``--as chief`` in every command
    (new user s39). With several admins, naming one is required: a usage error lists them.
    ``reads``: the read-only connection opened for it is kept in ``ctx.meta`` for the command
    (closed with the context); ``writes``: a read-write one, unless the command will ask for a
    confirmation (``confirmed_by`` not given: an absent ``--as`` is resolved after the options
    on the command line, so that flag is known by then), which would hold the file, and keep
    every analyst's connection waiting, for as long as the question stays unanswered."""
    if name is not None or ctx.resilient_parsing:
        return name
    db = ctx.params.get("db")
    parent = ctx.parent
    while db is None and parent is not None:  # `budget DB grant|cells grant`: the group's DB
        db, parent = parent.params.get("db"), parent.parent
    if db is None:  # a missing DB argument: click says so
        return None
    from sqlsdc.engines.duckdb import open_database

    con = None
    asks = confirmed_by is not None and not ctx.params.get(confirmed_by)
    if (reads or (writes and not asks)) and Path(db).is_file():
        con = ctx.meta[OPENED] = open_database(db, read_only=reads)
        ctx.call_on_close(con.close)
    try:
        return _the_admin(ctx, db, con)
    except BaseException:
        # click does not close a context whose options failed to parse: the connection would
        # stay open in the process (a command run in-process, then a read-write opening of the
        # same file: "open in this process with other settings")
        if con is not None:
            ctx.meta.pop(OPENED, None)
            con.close()
        raise


def _the_admin(ctx: click.Context, db, con) -> str | None:
    """:func:`acting_admin`'s answer from the policy in force (``con``: open on ``db``, or None)."""
    from sqlsdc.admin import admins
    from sqlsdc.errors import AccessDenied, PolicyError

    try:
        names = admins(db, policy=ctx.params.get("policy_file"), con=con)
    except PolicyError:  # `init` of an invalid policy: the command reports it in its --format
        return None
    if len(names) == 1:
        return names[0]
    if not names:
        raise AccessDenied("the policy declares no admin: declare one under `users:` with "
                           "role admin")  # fmt: skip
    raise click.UsageError(
        f"the policy has {len(names)} admins ({', '.join(names)}): name the acting one with --as",
        ctx,
    )


admin_option = acting_admin_option("--as", "--admin", "--user", "-u", "user")
reading_admin_option = acting_admin_option("--as", "--admin", "--user", "-u", "user", reads=True)
writing_admin_option = acting_admin_option("--as", "--admin", "--user", "-u", "user", writes=True)


@contextlib.contextmanager
def policy_problems(file: str, fmt: str):
    """With --format json, an invalid policy ``file`` is also reported on stdout as
    ``{"file": FILE, "valid": false, "problems": [...]}`` (the exit code stays 4, the problems
    also go to stderr): `policy validate`, `init` and `policy apply` alike; a script reading
    `init --format json` got nothing at all (new user s44g)."""
    from sqlsdc.errors import PolicyError

    try:
        yield
    except PolicyError as invalid:
        if fmt == "json":
            print_json({"file": file, "valid": False, "problems": invalid.problems})
        raise


def opened():
    """The connection :func:`acting_admin` opened for the running command, or None (``--as``
    given, or a question asked first: the command opens its own)."""
    return click.get_current_context().meta.get(OPENED)


def _report(report, fmt: str = "table") -> None:
    """What ``init`` or ``policy apply`` did; with --format json one object (notes included,
    on stdout with the rest)."""
    if fmt == "json":
        print_json({
            "version": report.version,
            "tables": {t: {"new_record_keys": rows, "one_row_per_unit": report.unit_per_row[t]}
                       for t, rows in report.keyed_rows.items()},
            "secret_created": report.secret_created,
            "notes": list(report.notes),
        })  # fmt: skip
        return
    click.echo(f"policy version {report.version} applied")
    for table, rows in report.keyed_rows.items():
        unit = "one row per unit" if report.unit_per_row[table] else "several rows per unit"
        click.echo(f"  {table}: {rows} new rows keyed; {unit}")  # rows, not keys: a unit has one
    if report.secret_created:
        click.echo("  created the PRF secret")
    for note in report.notes:
        click.echo(f"  note: {note}", err=True)


@click.command()
@click.argument("db", type=NamedPath(dir_okay=False))
@click.option(
    "--policy",
    "policy_file",
    required=True,
    type=ExistingFile(),
    help="Policy YAML file.",
)
@admin_option
@format_option(choices=("table", "json"))
def init(db: str, policy_file: str, user: str, fmt: str) -> None:
    """Create the sqlsdc catalog in DB and apply the policy.

    Gives every row of every confidential table a secret record key, creates the PRF secret and
    stores the policy as version 1. Running it again on an initialised database applies the
    policy as a new version and keys rows added since. The acting user must be an admin: of the
    policy in force, or on a new database, of the policy being applied. README, "Your own
    data", starts from a CSV file; the example applies the demo's policy again.

    \b
    Example:
      sqlsdc init demo.duckdb --policy schemas/examples/demo.yaml --format json
    """
    from sqlsdc.admin import init as init_database
    from sqlsdc.policy import load_policy

    with policy_problems(policy_file, fmt):  # the file's, or its fit to the data
        report = init_database(db, load_policy(policy_file), applied_by=user)
    _report(report, fmt)


@click.group(cls=CommandFirst)
def policy() -> None:
    """Validate, show and apply policies.

    \b
    Examples:
      sqlsdc policy validate schemas/examples/demo.yaml
      sqlsdc policy show demo.duckdb --history
      sqlsdc policy apply demo.duckdb schemas/examples/demo.yaml
    """


@policy.command()
@click.argument("file", type=ExistingFile())
@format_option(choices=("table", "json"))
def validate(file: str, fmt: str) -> None:
    """Check a policy file against the schema and its own rules (no database needed).

    An invalid file ends with exit code 4 and every problem on stderr, one per line; with
    --format json also {"file": FILE, "valid": false, "problems": [...]} on stdout.

    \b
    Example:
      sqlsdc policy validate schemas/examples/demo.yaml --format json
    """
    from sqlsdc.policy import load_policy

    with policy_problems(file, fmt):  # a script reading stdout got nothing at all
        load_policy(file)
    print_json({"file": file, "valid": True}) if fmt == "json" else click.echo(f"{file}: valid")


@policy.command()
@click.argument("db", type=ExistingFile())
@format_option(default="yaml", choices=("yaml", "json"))
@click.option("--history", is_flag=True, help="List all applied versions instead.")
def show(db: str, fmt: str, history: bool) -> None:
    """Print the policy in force (or the version history).

    \b
    Examples:
      sqlsdc policy show demo.duckdb
      sqlsdc policy show demo.duckdb --history --format json
    """
    import yaml  # here, not at start-up (12 ms of every command's --help)

    from sqlsdc import admin

    version, document, versions = admin.show(db)
    if history:
        rows = [
            dict(zip(("version", "applied_at", "applied_by", "source", "sha256"), v, strict=True))
            for v in versions
        ]
        print_json(rows) if fmt == "json" else click.echo(yaml.safe_dump(rows, sort_keys=False))
        return
    if fmt == "json":
        print_json({"version": version, "policy": document})
    else:
        click.echo(f"# policy version {version}")
        click.echo(yaml.safe_dump(readable(document), sort_keys=False, default_flow_style=None,
                                  width=100), nl=False)  # fmt: skip


def readable(document: dict) -> dict:
    """The stored policy (kept with sorted keys) in the order of the policy's JSON Schema, as
    its files are written: a column's ``role`` first, ``tables`` before ``users``; shown with
    leaf lists and mappings on one line (``{role: identifier}``, ``bounds: [0, 1000]``). It
    came out sorted and one value per line, ``budgets`` first and a column's ``bounds``
    before its ``role`` (new user s38)."""
    from sqlsdc.policy.validate import policy_schema

    schema = policy_schema()
    parts = schema.get("$defs", {})

    def ordered(mapping: dict, properties: dict) -> dict:
        rank = {key: i for i, key in enumerate(properties)}
        return dict(sorted(mapping.items(), key=lambda item: rank.get(item[0], len(rank))))

    def table(spec: dict) -> dict:
        spec = ordered(spec, parts["table"]["properties"])
        if isinstance(spec.get("columns"), dict):
            columns = parts["column"]["properties"]
            spec["columns"] = {name: ordered(c, columns) if isinstance(c, dict) else c
                               for name, c in spec["columns"].items()}  # fmt: skip
        return spec

    shown = ordered(document, schema["properties"])
    if isinstance(shown.get("tables"), dict):
        shown["tables"] = {name: table(t) if isinstance(t, dict) else t
                           for name, t in shown["tables"].items()}  # fmt: skip
    return shown


@policy.command()
@click.argument("db", type=ExistingFile())
@click.argument("file", type=ExistingFile())
@writing_admin_option
@format_option(choices=("table", "json"))
def apply(db: str, file: str, user: str, fmt: str) -> None:
    """Apply FILE to DB as a new policy version (earlier versions are kept).

    New rows of confidential tables are keyed; the report says how many (--format json for
    data).

    \b
    Example:
      sqlsdc policy apply demo.duckdb schemas/examples/demo.yaml --as admin
    """
    from sqlsdc import admin

    with policy_problems(file, fmt):
        report = admin.apply(db, file, user, con=opened())
    _report(report, fmt)


@click.command()
@click.argument("db", type=ExistingFile())
@reading_admin_option
@click.option("--who", help="Only queries of this user.")
@click.option("--decision", type=click.Choice(["accepted", "refused", "failed"]),
              help="Only entries with this decision.")  # fmt: skip
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, MAX_LIMIT),
              help="The newest this many entries.")  # fmt: skip
@click.option("--since", type=click.DateTime(_TIMES), metavar="TIME",
              help="Only entries logged at or after TIME (UTC): 2026-11-01 or "
              "'2026-11-01 08:00:00'.")  # fmt: skip
@click.option("--until", type=click.DateTime(_TIMES), metavar="TIME",
              help="Only entries logged before TIME (UTC).")  # fmt: skip
@click.option("--cell-limits", "cell_limits", is_flag=True,
              help="Instead of entries: what each user (--who: one) used of the policy's "
              "cell limits in the current period.")  # fmt: skip
@format_option()
def audit(
    db: str,
    user: str,
    who: str | None,
    decision: str | None,
    limit: int,
    since: datetime | None,
    until: datetime | None,
    cell_limits: bool,
    fmt: str,
) -> None:
    """Show the audit log: every query, accepted, refused or failed, newest first.

    Entries are listed in the order they were logged, which is not always that of their ids:
    QUERY_ID is drawn when a query, job or publication starts (its budget charges are recorded
    under it) and the entry is logged when it ends, so a publication comes after the queries it
    ran, which have higher ids. EPSILON, RHO and DELTA are the differential-privacy budget the
    query was charged (the ledger's charges under its id: `sqlsdc budget DB --ledger`); NULL
    (empty in CSV, null in JSON) where the ledger holds no charge under the id (a query
    protected otherwise, or refused). --format csv and json add the FINGERPRINT of the
    statement.

    \b
    Examples:
      sqlsdc audit demo.duckdb --who analyst --decision refused
      sqlsdc audit demo.duckdb --as admin --since 2026-11-01 --until 2026-12-01 --format csv
      sqlsdc audit demo.duckdb --cell-limits --who analyst
    """
    from sqlsdc import admin

    if cell_limits:  # distinct cells released per user, table and period (policy cell_limits)
        print_frame(admin.cell_limit_usage(db, user, who=who, con=opened()), fmt)
        return

    if since is not None and until is not None and since >= until:  # "(no rows)", exit 0
        raise click.BadParameter(
            f"{since} is not before --until {until}: no entry can lie between them",
            param_hint="'--since'",
        )
    frame = admin.audit(db, user, who=who, decision=decision, limit=limit + 1, since=since,
                        until=until, con=opened())  # fmt: skip
    if len(frame) > limit:  # it showed the newest 50 without a word (new user s39)
        frame = frame.iloc[:limit]
        click.echo(f"sqlsdc: the newest {limit} entries; --limit N for more", err=True)
    if fmt == "table":
        frame = frame.drop(columns=["fingerprint"])
        frame["sql_text"] = frame["sql_text"].str.replace(r"\s+", " ", regex=True)
    print_frame(frame, fmt)


@click.command()
@click.argument("db", type=ExistingFile())
@reading_admin_option
@format_option()
def outputs(db: str, user: str, fmt: str) -> None:
    """List the stored outputs of jobs (protect, anonymize, synthesize), oldest first.

    Each with its method, when and by whom it was made, under which policy version, the
    QUERY_ID of its job's audit entry, its SQL and the differential-privacy budget its job
    was charged (EPSILON, RHO, DELTA; NULL where nothing was charged). They are the tables
    protected.NAME that `sqlsdc publish` writes (`sqlsdc microdata-report` and
    `synth-report` report on anonymised and synthetic ones).

    \b
    Example:
      sqlsdc outputs demo.duckdb --format json
    """
    from sqlsdc import admin

    frame = admin.outputs(db, user, con=opened())
    if fmt == "table":
        frame["sql_text"] = frame["sql_text"].str.replace(r"\s+", " ", regex=True)
    print_frame(frame, fmt)


@click.command()
@click.argument("db", type=ExistingFile())
@acting_admin_option("--as", "--admin", "--user", "-u", "user", writes=True, confirmed_by="yes")
@click.option("--table", "tables", multiple=True, help="Only this table (repeatable).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@format_option(choices=("table", "json"))
def rekey(db: str, user: str, tables: tuple[str, ...], yes: bool, fmt: str) -> None:
    """Give every unit new record keys: ALL cell-key noise changes.

    Values published before no longer match new ones, and a user who saw both could compare
    them; re-key only when keys may have leaked. Every re-keying is recorded.

    \b
    Example:
      sqlsdc rekey demo.duckdb --table persons --yes
    """
    from sqlsdc import admin

    if not yes and not _can_ask():  # no one to answer: click printed "Aborted!" (exit 1)
        raise click.UsageError("re-keying asks for confirmation on a terminal; pass --yes")
    if not yes:  # the question on stderr: stdout is the output (JSON with --format json)
        click.confirm("Re-keying changes every published CKM value. Continue?", abort=True,
                      err=True)  # fmt: skip
    rekeyed = admin.rekey(db, user, tables=list(tables) or None, con=opened())
    if fmt == "json":
        print_json({"rekeyed_rows": rekeyed})
        return
    for table, rows in rekeyed.items():
        click.echo(f"{table}: {rows} rows re-keyed")


def _can_ask() -> bool:
    """Whether a question can be answered: standard input is a terminal."""
    return sys.stdin.isatty()


@click.command(cls=StatementCommand)
@click.argument("db", type=ExistingFile())
@click.argument("sql")
@admin_option
@click.option("--count", "count_column", required=True, help="Result column with the counts.")
@click.option("--value", "value_column", help="Result column with a magnitude (optional).")
@format_option(default="table", choices=("table", "json"))
def risk(db: str, sql: str, user: str, count_column: str, value_column, fmt: str) -> None:
    """Utility and risk of a protected table against the original (admins only; use - to read
    SQL from stdin).

    U, U_single, R_pert, R and the Hellinger distance of Geyer et al. (PSD 2022).

    \b
    Example:
      sqlsdc risk demo.duckdb "SELECT municipality, COUNT(*) AS n FROM persons
        GROUP BY municipality" --count n
    """
    from sqlsdc import admin

    measures = admin.ckm_measures(db, user, read_sql(sql), count=count_column, value=value_column)
    if fmt == "json":
        print_json(measures)
    else:
        for name, number in measures.items():
            click.echo(f"{name:>10}  {number:.6g}")


COMMANDS = (init, policy, audit, outputs, rekey, risk)
