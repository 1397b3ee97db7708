#!/usr/bin/env bash
# Apache Superset's connection test against `sqlsdc serve` (issue 21, a BI tool's connection
# test). Builds a demo database, gives the policy user `analyst` a server password, serves it
# over TLS (a self-signed certificate), then runs, with Superset's own code:
#   1. `superset test-db` (engine spec, SQLAlchemy dialect, connecting, SELECT 1; its last step
#      creates a table, which the server refuses: sessions are read-only);
#   2. scripts/bi_superset_check.py: the database dialog's "Test connection", a dataset sync,
#      charts as Superset writes their SQL, and the refusals of what the policy hides.
# Superset lives in its own virtualenv (scripts/superset_venv.sh makes one; SUPERSET_PYTHON
# names another). PYTHON: the Python with sqlsdc (default: python). Exit 0 when all holds.
# Usage: bash scripts/bi_superset.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python}"
superset_python="${SUPERSET_PYTHON:-$(bash scripts/superset_venv.sh)}"
superset="$(dirname "$superset_python")/superset"
work="$(mktemp -d -t sqlsdc-superset-XXXXXX)"
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

password="$("$python" -c 'import secrets; print(secrets.token_hex(16))')"
"$python" -m sqlsdc.cli demo --db "$work/demo.duckdb" --persons 20000 > /dev/null
printf '%s\n' "$password" | "$python" -m sqlsdc.cli server-user add "$work/demo.duckdb" analyst \
    --password-stdin > /dev/null
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=127.0.0.1 -keyout "$work/key.pem" -out "$work/cert.pem" 2> /dev/null
"$python" -m sqlsdc.cli serve "$work/demo.duckdb" --port 0 --tls-cert "$work/cert.pem" \
    --tls-key "$work/key.pem" > "$work/address" 2> "$work/serve.log" &
server=$!
for _ in $(seq 200); do [ -s "$work/address" ] && break; sleep 0.1; done
address="$(head -n 1 "$work/address")"
[ -n "$address" ] || { echo "sqlsdc serve did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }
uri="postgresql+psycopg2://analyst:${password}@${address}/demo?sslmode=require"
echo "sqlsdc serve on $address (TLS); Superset: $("$superset_python" -c \
    'import importlib.metadata as m; print(m.version("apache-superset"))')"

export SUPERSET_HOME="$work/superset"
SUPERSET_SECRET_KEY="$("$python" -c 'import secrets; print(secrets.token_hex(32))')"
export SUPERSET_SECRET_KEY
mkdir -p "$SUPERSET_HOME"
"$superset" db upgrade > "$work/upgrade.log" 2>&1 || { tail -20 "$work/upgrade.log" >&2; exit 1; }

echo "== superset test-db"
set +e
COLUMNS=200 "$superset" test-db "$uri" --connect-args '{}' > "$work/test-db.log" 2>&1
set -e
grep -v -E ":INFO:|^INFO|^\s*$" "$work/test-db.log" | sed "s/$password/***/g"
expected=("Found DB engine spec: PostgreSQL" "Connected successfully" "> 1"
          "CREATE statements are not allowed")
for text in "${expected[@]}"; do
    grep -q -F "$text" "$work/test-db.log" || { echo "FAIL superset test-db: no '$text'"; exit 1; }
done
echo "ok   superset test-db: connected, SELECT 1 answered, CREATE TABLE refused (read-only)"

echo "== Superset's database dialog, dataset sync and charts"
"$superset_python" scripts/bi_superset_check.py "$uri" 2> "$work/check.log" || {
    grep -v -E ":INFO:" "$work/check.log" | sed "s/$password/***/g" | tail -30 >&2
    exit 1
}
