"""Server users and SCRAM-SHA-256 authentication (RFC 5802, RFC 7677).

A server user is a policy user (its role and budget come from the policy) with a password that
an admin sets with ``sqlsdc server-user``. The catalog table ``sqlsdc.server_users`` stores only
what RFC 5802 section 3 calls the server's authentication information: salt, iteration count,
``StoredKey = H(ClientKey)`` and ``ServerKey = HMAC(SaltedPassword, "Server Key")``; neither the
password nor the salted password is stored, so the table does not let anyone log in.

The exchange is written here (section 5 of RFC 5802, with SHA-256 as RFC 7677 names it), not
taken from ``scramp``: libpq sends an empty user name in its client-first message (the user is in
the startup packet), which scramp's server refuses; scramp serves as the independent client in
the tests. Channel binding (SCRAM-SHA-256-PLUS) is not offered.

An unknown user goes through the same exchange with made-up keys (derived from a secret drawn
when the server starts) and fails at the same step with the same message as a wrong password,
as PostgreSQL does, so the server does not tell which user names exist.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import stringprep
import threading
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from sqlsdc.catalog import store
from sqlsdc.catalog.schema import CATALOG_SCHEMA, SERVER_USERS_DDL
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import AccessDenied, Error, NotFoundError
from sqlsdc.policy import load_policy

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # PostgreSQL's default (scram_iterations)
MIN_PASSWORD_LENGTH = 8
S = CATALOG_SCHEMA


@dataclass(frozen=True)
class ScramKeys:
    """RFC 5802 authentication information of one user (no password, no salted password)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def saslprep(password: str) -> str:
    """RFC 4013 SASLprep mapping and normalisation (non-ASCII spaces to space, "commonly
    mapped to nothing" characters removed, NFKC), as PostgreSQL applies it to passwords."""
    mapped = "".join(" " if stringprep.in_table_c12(c) else c for c in password
                     if not stringprep.in_table_b1(c))  # fmt: skip
    return unicodedata.normalize("NFKC", mapped)


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def make_keys(password: str, iterations: int = ITERATIONS, salt: bytes | None = None) -> ScramKeys:
    """RFC 5802 section 3: ``SaltedPassword = Hi(password, salt, i)`` (PBKDF2-HMAC-SHA-256),
    ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))``, ``ServerKey = HMAC(SaltedPassword,
    "Server Key")``, with a fresh 16-byte salt unless one is given."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise Error(f"the password is shorter than {MIN_PASSWORD_LENGTH} characters; choose a "
                    "longer one")  # fmt: skip
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode(), salt, iterations)
    stored = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
    return ScramKeys(salt, stored, _hmac(salted, b"Server Key"), iterations)


# --- administration (the admin CLI) ------------------------------------------------------------


def _open_as_admin(db: str | Path, admin: str):
    if not Path(db).is_file():
        raise NotFoundError(f"database {db} does not exist")
    con = engine.open_database(db)
    try:
        current = store.require_admin(con, admin)
        con.execute(SERVER_USERS_DDL)
    except BaseException:
        con.close()
        raise
    return con, load_policy(current[1], name=current[2])


def set_password(db: str | Path, admin: str, name: str, password: str, *, new: bool) -> None:
    """Add server user ``name`` (``new``) or change its password. ``name`` must be a user of
    the policy in force: the server runs its sessions as that user, with its role and budget."""
    keys = make_keys(password)
    con, policy = _open_as_admin(db, admin)
    try:
        if policy.user(name) is None:
            raise AccessDenied(f"user {name!r} is not declared in the policy in force; add it "
                               "under `users:` first (sessions run as a policy user)")  # fmt: skip
        exists = _row(con, name) is not None
        if new and exists:
            raise Error(f"server user {name!r} exists; change its password with "
                        "`sqlsdc server-user passwd`")  # fmt: skip
        if not new and not exists:
            raise NotFoundError(f"no server user {name!r}; add it with `sqlsdc server-user add`")
        now = store.now()
        con.execute(f"DELETE FROM {S}.server_users WHERE user_name = ?", [name])
        con.execute(
            f"INSERT INTO {S}.server_users VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [name, MECHANISM, keys.salt, keys.stored_key, keys.server_key, keys.iterations,
             now, admin],
        )  # fmt: skip
    finally:
        con.close()


def remove(db: str | Path, admin: str, name: str) -> None:
    con, _ = _open_as_admin(db, admin)
    try:
        if _row(con, name) is None:
            raise NotFoundError(f"no server user {name!r}")
        con.execute(f"DELETE FROM {S}.server_users WHERE user_name = ?", [name])
    finally:
        con.close()


def list_users(db: str | Path, admin: str) -> list[dict]:
    """Names, when their password was set and by whom (never a key)."""
    con, policy = _open_as_admin(db, admin)
    try:
        rows = con.execute(
            f"SELECT user_name, changed_at, changed_by FROM {S}.server_users ORDER BY user_name"
        ).fetchall()
    finally:
        con.close()
    return [{"user": u, "password_set_at": str(at), "set_by": by,
             "in_policy": policy.user(u) is not None} for u, at, by in rows]  # fmt: skip


def _row(con, name: str):
    return engine.one(con, f"SELECT salt, stored_key, server_key, iterations "
                           f"FROM {S}.server_users WHERE user_name = ?", [name])  # fmt: skip


USERS_REFRESH = 1.0  # seconds a reading of the server users serves handshakes


class ServerUsers:
    """The keys of the server users as ``sqlsdc serve`` reads them: the whole table at once,
    read again at most every :data:`USERS_REFRESH` seconds (a password set, changed or removed
    applies to the handshakes from the next reading on).

    So a stream of handshakes opens the file once a second at most. A handshake that opened the
    database file to look its user up, before any password, would let anyone who reaches the
    port (16 threads, 270 startup messages a second) keep the server process holding the file's
    lock nearly all the time, and an admin's command, a publication or an analyst's CLI in
    another process would wait 5 to 15 s for the file (red team s35b)."""

    def __init__(self, db: str | Path, refresh: float = USERS_REFRESH):
        self._db, self._refresh = db, refresh
        self._lock = threading.Lock()
        self._keys: dict[str, ScramKeys] = {}
        self._read_at: float | None = None

    def keys(self, name: str) -> ScramKeys | None:
        """The stored keys of server user ``name`` (None if there is none); called in the
        server's thread pool."""
        with self._lock:
            if self._read_at is None or time.monotonic() - self._read_at >= self._refresh:
                self._keys = _all_keys(self._db)
                self._read_at = time.monotonic()
            return self._keys.get(name)


def _all_keys(db: str | Path) -> dict[str, ScramKeys]:
    con = engine.open_database(db, writes_data=False)
    try:
        if engine.one(con, "SELECT 1 FROM duckdb_tables() WHERE schema_name = ? AND "
                           "table_name = 'server_users'", [S]) is None:  # fmt: skip
            return {}
        rows = con.execute(f"SELECT user_name, salt, stored_key, server_key, iterations "
                           f"FROM {S}.server_users").fetchall()  # fmt: skip
    finally:
        con.close()
    return {name: ScramKeys(bytes(salt), bytes(stored), bytes(server), iterations)
            for name, salt, stored, server, iterations in rows}  # fmt: skip


def decoy_secret(db: str | Path) -> bytes:
    """The key of the made-up salts of unknown users (:class:`ScramExchange`): derived from the
    database's PRF secret, so that a name shows the same salt after the server restarts, as a
    real user's does. Drawn afresh at each start, it changed the salt of every unknown name at
    a restart and of no real one, which told the names apart (red team s35b)."""
    con = engine.open_database(db, writes_data=False)
    try:
        row = engine.one(con, f"SELECT material FROM {S}.secrets WHERE name = 'prf'")
    finally:
        con.close()
    if row is None:  # a catalog without its secret answers no query either
        return secrets.token_bytes(32)
    return _hmac(bytes(row[0]), b"sqlsdc server: salts of unknown users")


# --- the exchange --------------------------------------------------------------------------------


class AuthenticationFailed(Exception):
    """Wrong password or unknown user (one message for both)."""


class ScramExchange:
    """The server side of one SCRAM-SHA-256 exchange (RFC 5802 section 5) for one user.

    ``keys`` is None for an unknown user: the exchange then runs over keys derived from
    ``decoy_secret`` and the name, and fails at the proof like a wrong password."""

    def __init__(self, user: str, keys: ScramKeys | None, decoy_secret: bytes):
        self.known = keys is not None
        if keys is None:
            seed = _hmac(decoy_secret, user.encode())
            keys = ScramKeys(seed[:16], secrets.token_bytes(32), seed, ITERATIONS)
        self.keys = keys
        self._header = self._bare = self._server_first = self._nonce = ""

    def first(self, client_first: bytes) -> bytes:
        """client-first-message -> server-first-message (``r=nonce,s=salt,i=count``)."""
        text = _text(client_first)
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag not in ("n", "y") or authzid:
            # "p=": channel binding, which is not offered; "a=NAME": an authorization identity
            # (act as NAME), which PostgreSQL refuses too: the session would run as the user
            # of the startup message while its client asked for another (red team s35b)
            raise AuthenticationFailed
        attributes = _attributes(bare)
        if "m" in attributes or "n" not in attributes or not attributes.get("r"):
            raise AuthenticationFailed
        self._header = f"{flag},{authzid},"
        self._bare = bare
        self._nonce = attributes["r"] + base64.b64encode(secrets.token_bytes(18)).decode()
        salt = base64.b64encode(self.keys.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={self.keys.iterations}"
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """client-final-message -> server-final-message (``v=signature``), or
        :class:`AuthenticationFailed` when the proof is wrong."""
        if not self._nonce:
            raise AuthenticationFailed
        text = _text(client_final)
        without_proof, sep, proof = text.rpartition(",p=")
        attributes = _attributes(without_proof)
        binding = base64.b64encode(self._header.encode()).decode()
        if not sep or attributes.get("c") != binding or attributes.get("r") != self._nonce:
            raise AuthenticationFailed
        try:
            proof_bytes = base64.b64decode(proof, validate=True)
        except ValueError:
            raise AuthenticationFailed from None
        message = f"{self._bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self.keys.stored_key, message)
        if len(proof_bytes) != len(signature):
            raise AuthenticationFailed
        client_key = bytes(a ^ b for a, b in zip(proof_bytes, signature, strict=True))
        valid = hmac.compare_digest(hashlib.sha256(client_key).digest(), self.keys.stored_key)
        if not (valid and self.known):
            raise AuthenticationFailed
        server_signature = base64.b64encode(_hmac(self.keys.server_key, message)).decode()
        return f"v={server_signature}".encode()


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed from None


def _attributes(text: str) -> dict[str, str]:
    """``a=1,b=2`` -> {"a": "1", "b": "2"}; a malformed attribute fails the exchange."""
    found = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if len(name) != 1 or not eq:
            raise AuthenticationFailed
        found.setdefault(name, value)
    return found
