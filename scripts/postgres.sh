#!/usr/bin/env bash
# A throwaway PostgreSQL server (Debian's package) for the tests, on loopback only:
#   scripts/postgres.sh start DIR [PORT]   makes a cluster in DIR, starts it, prints its URL
#   scripts/postgres.sh stop DIR           stops it (DIR stays until removed)
# The cluster belongs to the `postgres` user (PostgreSQL refuses to run as root); local
# connections are trusted, and the superuser is `evervm`. It serves TLS too, to those who ask
# (sslmode=...), with a certificate for 127.0.0.1 from a CA of its own: DIR/ca.pem.
set -euo pipefail
command="${1:?usage: scripts/postgres.sh start|stop DIR [PORT]}"
dir="$(realpath -m "${2:?usage: scripts/postgres.sh start|stop DIR [PORT]}")"
port="${3:-55432}"
bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
if [ -z "$bin" ] || [ ! -x "$bin/postgres" ]; then
    echo "PostgreSQL is not installed: apt-get install postgresql (scripts/setup.sh does)" >&2
    exit 1
fi
as_postgres() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case "$command" in
start)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir"
    as_postgres "$bin/initdb" -D "$dir/data" -A trust -U evervm >"$dir/initdb.log" 2>&1 ||
        { cat "$dir/initdb.log" >&2; exit 1; }
    # A CA of its own and a certificate for 127.0.0.1 signed by it (elliptic curves: quick).
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 2 \
        -subj "/CN=evervm test PostgreSQL CA" 2>"$dir/openssl.log" ||
        { cat "$dir/openssl.log" >&2; exit 1; }
    openssl req -new "${ec[@]}" -keyout "$dir/data/server.key" -out "$dir/server.csr" \
        -subj "/CN=127.0.0.1" 2>>"$dir/openssl.log" || { cat "$dir/openssl.log" >&2; exit 1; }
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
        >"$dir/server.ext"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
        -CAcreateserial -days 2 -extfile "$dir/server.ext" -out "$dir/data/server.crt" \
        2>>"$dir/openssl.log" || { cat "$dir/openssl.log" >&2; exit 1; }
    chmod 600 "$dir/data/server.key"
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir/data/server.key" "$dir/data/server.crt"
    as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c ssl=on" start >/dev/null ||
        { cat "$dir/server.log" >&2; exit 1; }
    echo "postgres://evervm@127.0.0.1:$port/postgres"
    ;;
stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_postgres "$bin/pg_ctl" -D "$dir/data" -m fast stop >/dev/null
    fi
    ;;
*)
    echo "usage: scripts/postgres.sh start|stop DIR [PORT]" >&2
    exit 2
    ;;
esac
