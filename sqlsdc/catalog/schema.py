"""DDL of the ``sqlsdc`` catalog schema that lives inside the protected database.

Tables:
    meta            catalog format version
    policy_versions every applied policy document, numbered; the highest is in force
    secrets         key material for keyed PRFs (never readable through a guarded connection)
    ckm_mix         the secret constants of the cell key method's keyed mix (statistic keys,
                    orphan references' keys; one row)
    audit           every query, accepted, refused or failed, with the reason
    ledger          every released cell: user, time, query fingerprint, cell identity, status
    ptables         every perturbation table generated, by its parameters (never changed)
    ptable_entries  their rows: transition probability, noise and integer key interval [lo, hi)
    key_events      record-key generations and re-keyings (which change all CKM noise)
    outputs         tables stored by back-end jobs (``protected.*``): what, how, by whom, and the
                    audit entry (``query_id``) under which the ledger holds their cells
    output_versions every version of those tables ever stored: its definition and report
    job_cells       the value each cell of a CTA, IPF or rounding job was published with by each
                    version, per job name and canonical population (its readers keep them all)
    job_units       each unit's inner cell and contribution in every version of a suppression,
                    rounding, CTA or IPF job, per canonical population: what changed between
                    two versions
    suppressions    per suppressed table: the fingerprint (data and settings) of its protected
                    universe ``suppressed__<table>``, when and under which policy it was made
    budget_events   privacy-budget grants and resets by administrators: who, when, why
    budget_spend    the DP spend ledger: one row per charged query (user, tables, ε, ρ, δ, cells)
    budget_lock     one row updated by every charge, so concurrent charges serialise
    cell_allowance  the distinct non-DP cells released to each user per table, and the periods
                    a refusal ended, for the policy's cell limits (catalog/cell_limits.py)
    cell_limit_events  administrators' grants of cells and resets of a cell limit's period:
                    who, when, why (catalog/cell_grants.py)
    dp_cells        noisy DP cells already released (and charged) per user and policy version
    server_users    passwords of ``sqlsdc serve`` users as SCRAM-SHA-256 keys (salt, StoredKey,
                    ServerKey; never the password): ``sqlsdc server-user``
"""

from __future__ import annotations

CATALOG_SCHEMA = "sqlsdc"
CATALOG_VERSION = 1

CKM_MIX_DDL = f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.ckm_mix (
    k_square BIGINT NOT NULL,
    k_scale BIGINT NOT NULL,
    k_shift BIGINT NOT NULL,
    k_final BIGINT NOT NULL)"""

# ``entry`` = sha256(user | policy_version | cell_hash), the table's one-column key: DuckDB looks
# up a one-column ART index per key, but scans the whole table for a compound key, so the cache
# look-up and the insert of every DP query would grow with the ledger.
DP_CELLS_DDL = f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.dp_cells (
        entry BLOB PRIMARY KEY,
        user_name VARCHAR NOT NULL,
        policy_version INTEGER NOT NULL,
        cell_hash VARCHAR NOT NULL,
        cell VARCHAR NOT NULL,
        column_name VARCHAR NOT NULL,
        statistic VARCHAR NOT NULL,
        value VARCHAR NOT NULL,
        query_id BIGINT NOT NULL,
        released_at TIMESTAMP NOT NULL)"""

CELL_ALLOWANCE = "cell_allowance"
# One row per cell released to a user from a table (``cells`` 1, ``cell_hash`` the cell's identity
# without the user, for the limits of all users together), and one per period a refusal ended
# (``cells`` 0, no hash); ``entry``, the key, is the sha256 of what identifies the row.
CELL_ALLOWANCE_DDL = f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.{CELL_ALLOWANCE} (
    entry VARCHAR PRIMARY KEY,
    user_name VARCHAR NOT NULL,
    table_name VARCHAR NOT NULL,
    cell_hash VARCHAR,
    cells BIGINT NOT NULL,
    released_at TIMESTAMP NOT NULL,
    query_id BIGINT NOT NULL)"""

CELL_LIMIT_EVENTS = "cell_limit_events"
# One row per grant of cells, or reset, of one cell limit (``user_name``, ``limit_table``,
# ``per``: the limit's user, '*' for all users together, table and period) in one period
# (``period_start``); ``cells``: the cells granted, or the use a reset cleared. Numbered from
# ``budget_seq``, as the budget events: one series of admin events.
CELL_LIMIT_EVENTS_DDL = f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.{CELL_LIMIT_EVENTS} (
    seq BIGINT PRIMARY KEY,
    event_at TIMESTAMP NOT NULL,
    admin VARCHAR NOT NULL,
    action VARCHAR NOT NULL CHECK (action IN ('grant', 'reset')),
    user_name VARCHAR NOT NULL,
    limit_table VARCHAR NOT NULL,
    per VARCHAR NOT NULL,
    period_start TIMESTAMP NOT NULL,
    cells BIGINT NOT NULL,
    reason VARCHAR NOT NULL)"""

SERVER_USERS_DDL = f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.server_users (
    user_name VARCHAR PRIMARY KEY,
    mechanism VARCHAR NOT NULL,
    salt BLOB NOT NULL,
    stored_key BLOB NOT NULL,
    server_key BLOB NOT NULL,
    iterations INTEGER NOT NULL,
    changed_at TIMESTAMP NOT NULL,
    changed_by VARCHAR NOT NULL)"""

DDL = (
    f"CREATE SCHEMA IF NOT EXISTS {CATALOG_SCHEMA}",
    f"CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.policy_versions (
        version INTEGER PRIMARY KEY,
        applied_at TIMESTAMP NOT NULL,
        applied_by VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        sha256 VARCHAR NOT NULL,
        document VARCHAR NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.secrets (
        name VARCHAR PRIMARY KEY,
        material BLOB NOT NULL,
        created_at TIMESTAMP NOT NULL)""",
    CKM_MIX_DDL,
    f"CREATE SEQUENCE IF NOT EXISTS {CATALOG_SCHEMA}.query_ids START 1",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.audit (
        query_id BIGINT PRIMARY KEY,
        logged_at TIMESTAMP NOT NULL,
        user_name VARCHAR NOT NULL,
        policy_version INTEGER,
        decision VARCHAR NOT NULL CHECK (decision IN ('accepted', 'refused', 'failed')),
        reason VARCHAR,
        fingerprint VARCHAR,
        sql_text VARCHAR NOT NULL,
        rows_returned BIGINT)""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.ledger (
        query_id BIGINT NOT NULL,
        released_at TIMESTAMP NOT NULL,
        user_name VARCHAR NOT NULL,
        fingerprint VARCHAR NOT NULL,
        cell VARCHAR NOT NULL,
        column_name VARCHAR NOT NULL,
        mechanism VARCHAR NOT NULL,
        status VARCHAR NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.suppressions (
        table_name VARCHAR PRIMARY KEY,
        fingerprint VARCHAR NOT NULL,
        policy_version INTEGER NOT NULL,
        created_at TIMESTAMP NOT NULL,
        cells BIGINT NOT NULL,
        report VARCHAR NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.ptables (
        ptable_id INTEGER PRIMARY KEY,
        kind VARCHAR NOT NULL,
        params VARCHAR NOT NULL,
        created_at TIMESTAMP NOT NULL,
        max_i DOUBLE NOT NULL,
        m1sq DOUBLE NOT NULL,
        UNIQUE (kind, params))""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.ptable_entries (
        ptable_id INTEGER NOT NULL,
        type VARCHAR NOT NULL,
        i DOUBLE NOT NULL,
        j DOUBLE NOT NULL,
        p DOUBLE NOT NULL,
        v DOUBLE NOT NULL,
        lo BIGINT NOT NULL,
        hi BIGINT NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.key_events (
        event_at TIMESTAMP NOT NULL,
        by_user VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        action VARCHAR NOT NULL,
        rows_keyed BIGINT NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.outputs (
        name VARCHAR PRIMARY KEY,
        method VARCHAR NOT NULL,
        sql_text VARCHAR NOT NULL,
        created_at TIMESTAMP NOT NULL,
        created_by VARCHAR NOT NULL,
        policy_version INTEGER NOT NULL,
        report VARCHAR NOT NULL,
        query_id BIGINT)""",
    # every version of an output ever stored, appended (outputs keeps the current one): the
    # differencing check compares a new release with the versions readers keep
    # (sqlsdc.jobs.output_history)
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.output_versions (
        query_id BIGINT,
        name VARCHAR NOT NULL,
        method VARCHAR NOT NULL,
        sql_text VARCHAR NOT NULL,
        report VARCHAR NOT NULL)""",
    # the value each cell of a CTA, IPF or rounding job was last published with, per job name,
    # method and canonical population: later versions keep each cell's side, rounding and
    # secret factor across versions of other populations (sqlsdc.jobs.kept_cells)
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.job_cells (
        name VARCHAR NOT NULL,
        method VARCHAR NOT NULL,
        population VARCHAR NOT NULL,
        cell VARCHAR NOT NULL,
        value DOUBLE NOT NULL,
        query_id BIGINT NOT NULL)""",
    # each unit's inner cell (its codes by dimension name) and contribution in every version
    # of a suppression job, per canonical population: the units a later version's cells
    # differ by (sqlsdc.jobs.revisions)
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.job_units (
        population VARCHAR NOT NULL,
        query_id BIGINT NOT NULL,
        unit VARCHAR NOT NULL,
        cell VARCHAR NOT NULL,
        value DOUBLE NOT NULL)""",
    # --- differential privacy: budgets, spend ledger, released-cell cache (catalog/budget.py).
    # Amounts are exact rationals stored as text ("1/3"); user '*' / table '*' mean "all".
    f"CREATE SEQUENCE IF NOT EXISTS {CATALOG_SCHEMA}.budget_seq START 1",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.budget_events (
        seq BIGINT PRIMARY KEY,
        event_at TIMESTAMP NOT NULL,
        admin VARCHAR NOT NULL,
        action VARCHAR NOT NULL CHECK (action IN ('grant', 'set', 'reset')),
        user_name VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        epsilon VARCHAR,
        rho VARCHAR,
        delta VARCHAR,
        reason VARCHAR NOT NULL)""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.budget_spend (
        seq BIGINT PRIMARY KEY,
        query_id BIGINT NOT NULL,
        charged_at TIMESTAMP NOT NULL,
        user_name VARCHAR NOT NULL,
        tables VARCHAR[] NOT NULL,
        epsilon VARCHAR NOT NULL,
        rho VARCHAR NOT NULL,
        delta VARCHAR NOT NULL DEFAULT '0',
        cells BIGINT NOT NULL,
        policy_version INTEGER)""",
    f"""CREATE TABLE IF NOT EXISTS {CATALOG_SCHEMA}.budget_lock (
        id INTEGER PRIMARY KEY,
        charges BIGINT NOT NULL)""",
    DP_CELLS_DDL,
    SERVER_USERS_DDL,
    CELL_ALLOWANCE_DDL,
    CELL_LIMIT_EVENTS_DDL,
)
