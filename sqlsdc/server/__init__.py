"""``sqlsdc serve``: a PostgreSQL protocol v3 server over guarded connections.

Layout: ``codec`` (message framing and formats), ``types`` (type OIDs, text and binary values),
``auth`` (server users, SCRAM-SHA-256), ``catalog`` (session statements answered without the
guard), ``session`` (one client's protocol state), ``serve`` (the listening server).
"""
