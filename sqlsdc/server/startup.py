"""Startup and authentication of a server session: TLS negotiation, SCRAM-SHA-256 (RFC 5802,
RFC 7677) and the guarded connection of the authenticated user (PostgreSQL documentation
55.2.1 "Start-up")."""

from __future__ import annotations

from sqlsdc.errors import AccessDenied, Error
from sqlsdc.server import codec
from sqlsdc.server.auth import MECHANISM, AuthenticationFailed, ScramExchange
from sqlsdc.server.catalog import SessionCatalog
from sqlsdc.server.codec import ProtocolError
from sqlsdc.server.shadow import SERVER_VERSION
from sqlsdc.server.sqlstate import Fatal, error_fields


class Startup:
    """The start-up of :class:`sqlsdc.server.session.Session` (a mixin: it reads and sets the
    session's state)."""

    async def _startup(self) -> bool:
        for _ in range(3):  # an SSLRequest and a GSSENCRequest may come before the startup
            code, body = await codec.read_startup(self.reader)
            if code == codec.SSL_REQUEST:
                body.end()
                if self.server.ssl_context is not None and not self.tls:
                    if self.reader._buffer:  # noqa: SLF001 - asyncio has no public way to ask
                        # bytes sent in clear before our answer would be read as if they came
                        # through TLS (PostgreSQL's CVE-2021-23214)
                        raise ProtocolError("received unencrypted data after SSL request")
                    self.writer.write(b"S")
                    await self.writer.drain()
                    await self.writer.start_tls(self.server.ssl_context)
                    self.tls = True
                else:
                    self.writer.write(b"N")
                continue
            if code == codec.GSSENC_REQUEST:
                self.writer.write(b"N")
                continue
            if code == codec.CANCEL_REQUEST:
                pid, secret = body.int32(), body.int32()
                self.server.cancel(pid, secret)
                return False
            if code >> 16 == 3:
                return await self._authenticate(code, codec.parse_startup(body))
            raise ProtocolError(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}; "
                                "this server speaks 3.0")  # fmt: skip
        raise ProtocolError("too many negotiation requests before the startup message")

    async def _authenticate(self, code: int, params: dict[str, str]) -> bool:
        options = [k for k in params if k.startswith("_pq_.")]
        if code & 0xFFFF or options:
            self._send(codec.negotiate_protocol_version(0, options))
        if not self.tls and not self.server.insecure:
            raise Fatal("28000", "this server accepts only TLS connections",
                        "connect with sslmode=require")  # fmt: skip
        self.user = params.get("user", "")
        if not self.user:
            raise Fatal("28000", "no user name in the startup message")
        host = (self.writer.get_extra_info("peername") or ("",))[0]
        attempt = self.server.login_attempts.begin(self.user, host)  # or refused: too many
        keys = await self.server.in_pool(self.server.users.keys, self.user)
        exchange = ScramExchange(self.user, keys, self.server.decoy_secret)
        self._send(codec.sasl_mechanisms(MECHANISM))
        await self.writer.drain()
        failed = Fatal("28P01", f'password authentication failed for user "{self.user}"')
        mechanism, first = codec.parse_sasl_initial(await self._expect_password())
        if mechanism != MECHANISM:
            raise Fatal("28000", f"SASL mechanism {mechanism!r} is not offered; use {MECHANISM}")
        try:
            self._send(codec.authentication(codec.AUTH_SASL_CONTINUE, exchange.first(first)))
            await self.writer.drain()
            final = exchange.final((await self._expect_password()).rest())
        except AuthenticationFailed:
            self.server.login_attempts.failed(self.user, host)  # logged
            raise failed from None
        self.server.login_attempts.succeeded(attempt)
        if self.server.logged_in() >= self.server.settings.max_connections:
            raise Fatal("53300", "sorry, too many clients already")
        if self.server.logged_in(self.user) >= self.server.settings.user_connections:
            raise Fatal("53300", f'too many connections for role "{self.user}"',
                        f"one user may hold {self.server.settings.user_connections} sessions "
                        "(--max-connections-per-user); close some")  # fmt: skip
        self.user_connected = True
        self._send(codec.authentication(codec.AUTH_SASL_FINAL, final))
        self._send(codec.authentication(codec.AUTH_OK))
        try:
            self.connection = await self.server.in_pool(
                self.server.connect, self.server.db, self.user
            )
        except Error as e:
            fields = error_fields(e)
            raise Fatal("28000" if isinstance(e, AccessDenied) else fields.code,
                        fields.text, fields.hint) from None  # fmt: skip
        self.catalog = SessionCatalog(self.connection)
        for name, value in self._parameters(params.get("application_name", "")):
            self._send(codec.parameter_status(name, value))
        self._send(codec.backend_key_data(self.pid, self.secret))
        self._send(codec.ready_for_query(self.status))
        await self.writer.drain()
        return True

    async def _expect_password(self) -> codec.Reader:
        kind, body = await codec.read_message(self.reader, limit=10_000)
        if kind != b"p":
            raise ProtocolError("expected a SASL response during authentication")
        return body

    def _parameters(self, application: str) -> list[tuple[str, str]]:
        return [("server_version", SERVER_VERSION), ("server_encoding", "UTF8"),
                ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"), ("TimeZone", "UTC"),
                ("IntervalStyle", "postgres"), ("integer_datetimes", "on"),
                ("standard_conforming_strings", "on"), ("is_superuser", "off"),
                ("session_authorization", self.user), ("application_name", application),
                ("default_transaction_read_only", "on"), ("in_hot_standby", "off")]  # fmt: skip
