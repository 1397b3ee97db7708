"""The PostgreSQL-protocol server: every statement of every session passes the guard."""
