"""The DP release of a guarded connection's statements: charged first, then drawn and cached.

For a statement with DP aggregations, :meth:`DpCharging._release_dp` decides everything the
policy and the public domains decide (sizes, the answer's rows, private keys' types) before
the charge, charges and commits the statistics not paid before, and only then computes the
exact cells and draws the noise (:mod:`sqlsdc.guard.dp_release`), so a statement stopped
afterwards has paid. The cells drawn are cached with the answer (:meth:`DpCharging._cache_cells`)
or, when the answer fails, on their own (:meth:`DpCharging._keep_released`), and with them the
statistics the charge paid for: a statistic counts as paid for a later asking only once its
cells are cached. An asking stopped between its charge and that caching (the statement timeout,
which a connection may shorten, a cancel, a kill) leaves its statistics unpaid, and the next
asking pays them again: else each later asking computed the exact cells again for free until
one completed, censored timings of the engine's work for one payment (red team s41b). A DP cell's
identity names the data version of each table it reads (:meth:`DpCharging._data_version`)
and its noise is keyed by the database's PRF secret (:meth:`DpCharging._secret`).

:class:`DpCharging` holds these methods of :class:`sqlsdc.guard.connection.Connection`, which
sets the state they read (``_con``, ``_context``, ``user``, ``path``, ``_dp_noise``,
``_writers``, ``_versions_writers``, ``_data_versions``, ``_key_types``, ``_budget``,
``_prf_key``, ``_reopen``, ``_settle``) and gives ``_time_left``, ``_check_engine_texts``
and ``_check_answer_rows``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from sqlsdc.catalog import store
from sqlsdc.catalog.budget import Charge, PolicyChanged, charge, check_policy, policy_limits
from sqlsdc.catalog.dp_cache import cache_cells, cached_cells, released_groups
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema
from sqlsdc.errors import Error
from sqlsdc.guard import dp_in_flight
from sqlsdc.guard.dp_pricing import (
    check_private_keys,
    check_sizes,
    data_versions_of,
    no_rows,
    prefetching,
    price,
    resolve_domains,
)
from sqlsdc.guard.dp_release import DpRelease, release
from sqlsdc.guard.engine_reads import ENGINE_CHECKED_TEXTS
from sqlsdc.guard.holding import database_lock
from sqlsdc.guard.pipeline import ProtectedQuery


def read_secret(con) -> bytes:
    """The database's PRF secret, which keys every DP cell's noise (never logged)."""
    row = engine.one(con, f"SELECT material FROM {store.S}.secrets WHERE name = 'prf'")
    if row is None:
        raise Error("this database has no PRF secret; an admin must re-apply the policy")
    return bytes(row[0])


class DpCharging:
    """Charge, draw and cache the noisy cells of a statement's DP aggregations."""

    def _keep_released(
        self, noisy: DpRelease | None, query_id: int | None, paid: Charge | None = None
    ) -> bool:
        """Best effort, after an answer that failed once its DP cells were drawn (an answer
        over the byte cap, the timeout): cache the cells, the groups private selections
        released and the statistics the charge paid for, which the answer's transaction did
        not keep; whether they were kept. Asked again, the statistics are paid and the stage
        is answered from the cache without its exact cells: else an answer made to fail each
        time (a long literal beside the cells) computed them at every asking, timed for free
        (red team s37b). Not kept, the next asking pays again. The values are those any
        asking draws (the noise is a function of the cell). ``paid``'s ledger row counts the
        cells kept, as an answered statement's counts its cells: the next asking, which
        releases them, charges nothing (red team s41k: they were counted nowhere). A COMMIT
        that raised is read back (:meth:`_kept_cells`): DuckDB may raise from one it has
        written (an interrupt as it ends, red team s48b), and the analyst told "asking again is
        charged again" of kept cells was told wrong."""
        if noisy is None or not self._dp_noise or query_id is None:
            return False
        if not (noisy.cells or noisy.releases or noisy.statistics):
            return False
        con = self._con
        try:
            con.execute(engine.parsed("BEGIN TRANSACTION"))
            cache_cells(con, user=self.user, policy_version=self._context.policy_version,
                        query_id=query_id, cells=noisy.cells, paid_by=paid, again=True,
                        releases=noisy.releases, statistics=noisy.statistics)  # fmt: skip
            con.execute(engine.parsed("COMMIT"))
            return True
        except engine.EngineError:
            engine.rollback(con)
            return self._kept_cells(noisy)

    def _kept_cells(self, noisy: DpRelease) -> bool:
        """Whether the cache holds every cell and paid statistic of ``noisy`` and every group
        release it made, read after a failed keeping (as :func:`~sqlsdc.catalog.budget.charge`
        reads back its ledger row); a failed read is "no", which tells the analyst to expect a
        charge (fail closed)."""
        version = self._context.policy_version
        digests = {c.identity.digest for c in (*noisy.cells, *noisy.statistics)}
        try:
            if len(cached_cells(self._con, self.user, version, digests)) < len(digests):
                return False
            return all(released_groups(self._con, self.user, version, digest) is not None
                       for digest, _ in noisy.releases)  # fmt: skip
        except engine.EngineError:
            return False

    def _release_dp(
        self, query: ProtectedQuery, query_id: int | None, sql: str, *, run=None,
        data_version=None,
    ) -> tuple[DpRelease, Charge | None]:  # fmt: skip
        """Noisy cells of the query's DP aggregations, their cost charged to the ledger first,
        and the charge (None when every statistic was paid before). The statistics charged
        are left in the release (:attr:`DpRelease.statistics`), to be cached with its cells:
        paid for a later asking from then on, not from the charge. ``query_id`` None: the
        charge draws it (left in ``_query_id`` for the audit entry before the charge commits,
        so also when this raises, Ctrl-C included), or else the audit entry. The charge writes
        the query's audit entry (``sql``) with its ledger row, which the outcome replaces.
        The drawn cells are cached by :meth:`_cache_cells`.

        Order matters (ISSUE16 must-have 6): the statistics not paid before are charged and
        committed *before* any exact cell is computed, so a query that then fails, is
        interrupted or times out has paid; only the public domains and the tables' data
        versions are read before. Whatever the query, the policy and the public domains decide
        is decided before the charge, so that no refusal comes after it: DuckDB's reading of
        every text (the answer's too), the size of quantiles
        (:func:`~sqlsdc.guard.dp_pricing.check_sizes`), the most rows the answer can have
        (:meth:`_check_answer_rows`) and the types of private group keys
        (:func:`~sqlsdc.guard.dp_pricing.check_private_keys`, from the cells' SQL with no
        row). The drawn cells are cached afterwards (free), with the answer. The noise is
        drawn under the statement's timeout (a quantile's draw included, which the engine's
        interrupt does not reach): stopped there, the query has paid, as one stopped while
        the engine computed its exact cells, and its next asking pays again (nothing of it
        was cached).

        ``run`` (SQL text -> Arrow) and ``data_version`` (table -> version) default to this
        connection's DuckDB; the Spark path passes its engine's (:mod:`sqlsdc.guard.spark`)."""
        con, context = self._con, self._context
        self._check_engine_texts(query)  # the answer's text too: refused unpaid
        version = context.policy_version
        writers = engine.data_writers(self.path)
        if writers is None or writers != self._writers:  # written in this process, perhaps
            try:  # a policy applied there: its cache answers nothing at the old version
                check_policy(con, version)
            except PolicyChanged:
                self._reopen = True
                raise
            self._data_versions.clear()
            self._key_types.clear()
            self._writers = writers

        key_types = None  # known for DuckDB's stages (Spark's types are its own)
        if run is None:
            key_types = self._key_types
            if len(key_types) >= ENGINE_CHECKED_TEXTS:
                key_types.clear()

            def run(text: str):
                return engine.run(con, text, timeout=self._time_left())

        data_version = data_version or self._data_version

        declared = context.policy.table
        data_versions = data_versions_of(query.dp_stages, data_version,
                                         lambda name: declared(name) is not None)  # fmt: skip
        domains = resolve_domains(query.dp_stages, run)  # public values only
        check_sizes(query.dp_stages, domains)  # decided before the charge, never after
        self._check_answer_rows(query, domains, run)
        check_private_keys(query.dp_stages, lambda stage: run(context.to_sql(no_rows(stage))),
                           key_types)  # fmt: skip
        where = Path(self.path).resolve()
        lock = database_lock(where)  # charges of this process wait for each other
        paid = None
        while True:  # until no other statement of this process is releasing the statistics
            cached = prefetching(lambda digests: cached_cells(con, self.user, version, digests),
                                 query.dp_stages, data_versions=data_versions,
                                 domains=domains)  # fmt: skip
            if not self._dp_noise:
                break
            with lock:  # priced under it too: a statistic released meanwhile is not paid
                cost = price(query.dp_stages, data_versions=data_versions, domains=domains,
                             paid=cached)  # fmt: skip
                keys = [(str(where), self.user, version, s.identity.digest)
                        for s in cost.statistics]  # fmt: skip
                running = dp_in_flight.busy(keys)
                if not running:
                    try:
                        paid = charge(con, user=self.user, tables=query.tables, cost=cost.cost,
                                      query_id=query_id, limits=policy_limits(context.policy),
                                      policy_version=version, state=self._budget, sql=sql,
                                      fingerprint=query.fingerprint,
                                      drawn=partial(setattr, self, "_query_id"))  # fmt: skip
                    except PolicyChanged:  # applied by this process: the file stays open
                        self._reopen = True
                        raise
                    if paid is not None:
                        self._settle = dp_in_flight.claim(keys)
                    break
            dp_in_flight.wait(running, self._time_left)  # nothing charged nor computed yet
        noisy = release(query.dp_stages, run, secret=self._secret(), policy_version=version,
                        data_versions=data_versions, cached=cached, noise=self._dp_noise,
                        domains=domains, key_types=key_types, time_left=self._time_left,
                        released=lambda digest: released_groups(con, self.user, version,
                                                                digest),
                        describe=lambda stage: run(context.to_sql(no_rows(stage))))  # fmt: skip
        if paid is not None:
            noisy.statistics = cost.statistics  # paid for later askings once cached
        return noisy, paid

    def _cache_cells(
        self, noisy: DpRelease | None, paid: Charge | None, query_id: int, *, again=False
    ) -> None:
        """Cache the cells a DP query drew and the statistics its charge paid for (and count
        the cells on its charge), in the transaction that records its answer
        (:func:`~sqlsdc.catalog.dp_cache.cache_cells`)."""
        if noisy is None or not self._dp_noise or not (noisy.cells or noisy.releases or paid):
            return
        cache_cells(self._con, user=self.user, policy_version=self._context.policy_version,
                    query_id=query_id, cells=noisy.cells, paid_by=paid, again=again,
                    releases=noisy.releases, statistics=noisy.statistics)  # fmt: skip

    def _settle_charged(self) -> None:
        """Let statements waiting on the statistics this one charged price them again
        (:mod:`sqlsdc.guard.dp_in_flight`): called once its cells were cached or it stopped."""
        settle, self._settle = self._settle, None
        if settle is not None:
            settle()

    def _secret(self) -> bytes:
        """The PRF key, read once per opening of the file (kept in memory only, as the
        engine's own pages hold it; never logged)."""
        if self._prf_key is None:
            self._prf_key = read_secret(self._con)
        return self._prf_key

    def _data_version(self, table: str) -> str:
        """A fingerprint of the table's rows, part of every DP cell's identity: the same cell
        over changed data gets fresh noise (and a new charge), never the old noise on a new
        value. Computed once per opening of the file (while it is open, DuckDB locks it against
        other processes' writers), and again after a connection of this process that may write
        data opened it (:meth:`_release_dp`)."""
        if table not in self._data_versions:
            self._data_versions[table] = duckdb_schema.data_version(self._con, table)
        return self._data_versions[table]

    def _current_data_version(self, table: str) -> str:
        """:meth:`_data_version` outside a DP charge (the cell limits' identity of a cell:
        free again only over the same data), first forgetting the versions read when a
        connection of this process that may write data opened the file since."""
        writers = engine.data_writers(self.path)
        if writers is None or writers != self._versions_writers:
            self._data_versions.clear()
            self._versions_writers = writers
        return self._data_version(table)
