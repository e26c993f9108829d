#!/usr/bin/env bash
# Starts the services that idem's tests, examples and demo use, when they are not running
# already: PostgreSQL, the `tansu` Kafka-API broker and, when asked, Redis and two PgBouncer
# poolers. Running instances are reused; everything listens on loopback only; `down` stops
# only what this script started.
#
#   scripts/services.sh [up] [--print-env] [postgres] [kafka] [redis] [pgbouncer] [prometheus]
#                                  start what is missing (default: postgres kafka); with
#                                  --print-env, progress goes to stderr and stdout gets
#                                  `export DATABASE_URL=...` / `export REDIS_URL=...` /
#                                  `export IDEM_PGBOUNCER_SESSION_URL=...` /
#                                  `export IDEM_PGBOUNCER_TRANSACTION_URL=...` /
#                                  `export PROMETHEUS_URL=...` / `export PROMTOOL=...` lines
#                                  for `eval` (how test.sh and demo.sh use it)
#   scripts/services.sh down       stop what this script started
#   scripts/services.sh status     show what runs
#
# PostgreSQL: a server that accepts DATABASE_URL is reused. When nothing answers there (on
# loopback), the script runs a private cluster: `initdb` into $IDEM_SERVICES_DIR/postgres
# (trust authentication, loopback only, no Unix socket), started with `pg_ctl` on
# DATABASE_URL's port. Without DATABASE_URL, a server on 127.0.0.1:5432 that refuses user
# `postgres` without a password is left alone and the private cluster takes the next free
# port; the URL to use is printed (and exported with --print-env). PostgreSQL refuses to
# run as root: as root, the private cluster runs as the user `postgres` (or `nobody`).
# Redis: the same, with a private `redis-server` (no persistence) when none answers PING
# at REDIS_URL.
# PgBouncer (`pgbouncer`, which implies `postgres`): two private instances in front of the
# PostgreSQL in use, one with pool_mode = session and one with pool_mode = transaction, on
# free loopback ports from 6432 on (each in $IDEM_SERVICES_DIR/pgbouncer-<mode>: ini,
# userlist, pid file, log; no Unix socket). They take any database name, trust their
# clients, log in to the server as DATABASE_URL's user (with its password, if any), keep 8
# server connections per database and user (default_pool_size), ignore the startup
# parameter extra_float_digits (sqlx sends it) and let DATABASE_URL's user read the admin
# console (database `pgbouncer`: SHOW CONFIG, SHOW POOLS). One that runs is reused, or
# restarted when the server or the user changed. As root, they run as the user `postgres`
# (or `nobody`): PgBouncer refuses root too.
# Prometheus (`prometheus`): a private server in $IDEM_SERVICES_DIR/prometheus (its
# configuration, data, pid file and log) on a free loopback port from PROMETHEUS_PORT on,
# scraping every second the targets of PROMETHEUS_TARGETS (rewritten at each `up`; the
# server picks them up within a second) and evaluating the rule files of PROMETHEUS_RULES;
# `promtool` comes with it. Installing the package may start its own service: this script
# stops and disables it.
# Missing server programs are installed with apt-get or dnf when this runs as root or with
# password-less sudo; otherwise the script stops with the command to run.
#
# Environment:
#   IDEM_SERVICES_DIR  pid files, logs, the private cluster, the poolers' settings and the
#                      broker's storage (default: ${TMPDIR:-/tmp}/idem-services)
#   DATABASE_URL       where PostgreSQL is expected (default postgres://postgres@127.0.0.1:5432/postgres)
#   REDIS_URL          where Redis is expected (default redis://127.0.0.1:6379)
#   REDIS_PORT         Redis's port on 127.0.0.1 when REDIS_URL is not set (default 6379)
#   KAFKA_PORT         the broker's port on 127.0.0.1 (default 9092)
#   PROMETHEUS_PORT    the first port the private Prometheus may take (default 9090)
#   PROMETHEUS_TARGETS what it scrapes, host:port[,host:port...] (/metrics of each)
#   PROMETHEUS_RULES   rule files it evaluates, path[,path...]
#   IDEM_KAFKA_FRESH=1 a tansu that this script started is restarted on empty storage
#                      (test.sh sets it: the broker's storage of earlier runs slows it
#                      down; a demo consuming from it meanwhile loses its topic)
#   IDEM_NO_INSTALL=1  fail with the command to run instead of installing what is missing
#                      (tansu, PostgreSQL's or Redis's server programs, pgbouncer,
#                      prometheus)
set -euo pipefail

TANSU_VERSION=0.6.0
TANSU_INSTALL="cargo install tansu --version ${TANSU_VERSION} --locked --features libsql"
STATE_DIR=${IDEM_SERVICES_DIR:-${TMPDIR:-/tmp}/idem-services}
KAFKA_PORT=${KAFKA_PORT:-9092}
DEFAULT_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
# An explicit DATABASE_URL or REDIS_URL is obeyed: a server there that refuses is an error.
# The defaults give way to a private server on another port.
DATABASE_URL_GIVEN=${DATABASE_URL:+1}
DATABASE_URL=${DATABASE_URL:-$DEFAULT_DATABASE_URL}
REDIS_URL_GIVEN=${REDIS_URL:+1}${REDIS_PORT:+1}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:${REDIS_PORT:-6379}}
PRINT_ENV=0
EXIT_MISSING=3 # a server program is missing and this script cannot install it

say() {
    if ((PRINT_ENV)); then
        printf '%s\n' "$*" >&2
    else
        printf '%s\n' "$*"
    fi
}
fail() {
    printf 'services.sh: %s\n' "$*" >&2
    exit 1
}

port_open() { # host port
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

wait_port() { # host port seconds
    local deadline=$((SECONDS + $3))
    until port_open "$1" "$2"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

wait_port_closed() { # host port seconds
    local deadline=$((SECONDS + $3))
    while port_open "$1" "$2"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

free_port() { # first: the first port from there on where nothing listens on 127.0.0.1
    local port=$1
    while port_open 127.0.0.1 "$port"; do
        ((port < $1 + 200)) || fail "no free port on 127.0.0.1 between $1 and $port"
        port=$((port + 1))
    done
    printf '%s\n' "$port"
}

is_loopback() {
    case $1 in
    localhost | ::1 | 127.*) return 0 ;;
    *) return 1 ;;
    esac
}

urldecode() {
    printf '%b' "${1//%/\\x}"
}

# Splits scheme://[user[:password]@]host[:port][/path][?query] into url_user,
# url_password, url_host, url_port and url_path (user, password and path percent-decoded).
parse_url() { # url default_port
    local rest=${1#*://} authority userinfo=""
    authority=${rest%%[/?]*}
    rest=${rest:${#authority}}
    if [[ $authority == *@* ]]; then
        userinfo=${authority%@*}
        authority=${authority##*@}
    fi
    url_user=$(urldecode "${userinfo%%:*}")
    url_password=""
    [[ $userinfo == *:* ]] && url_password=$(urldecode "${userinfo#*:}")
    if [[ $authority == \[* ]]; then # [IPv6]:port
        url_host=${authority#\[}
        url_host=${url_host%%]*}
        url_port=${authority#*]}
        url_port=${url_port#:}
    else
        url_host=${authority%%:*}
        url_port=""
        [[ $authority == *:* ]] && url_port=${authority##*:}
    fi
    [[ -n $url_host ]] || url_host=localhost
    [[ -n $url_port ]] || url_port=$2
    rest=${rest%%\?*}
    url_path=$(urldecode "${rest#/}")
}

# ---------------------------------------------------------------------------------------
# Installing missing server programs

# Runs a command as root: directly when root, through sudo when it needs no password.
can_be_root() {
    [[ $(id -u) -eq 0 ]] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; }
}
as_root() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    else
        sudo -n "$@"
    fi
}

# install_packages what debian-packages fedora-packages other-hint
# Installs with apt-get or dnf where it can; otherwise stops with the command to run.
install_packages() {
    local what=$1 apt_packages=$2 dnf_packages=$3 hint=$4 command="" sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo "
    if command -v apt-get >/dev/null 2>&1; then
        command="apt-get install -y --no-install-recommends $apt_packages"
    elif command -v dnf >/dev/null 2>&1; then
        command="dnf install -y $dnf_packages"
    fi
    if [[ -z $command ]]; then
        printf 'services.sh: %s is not installed, and this script knows no package manager here to install it.\n  Install it (%s), then run this again.\n' "$what" "$hint" >&2
        exit "$EXIT_MISSING"
    fi
    if [[ ${IDEM_NO_INSTALL:-0} == 1 ]] || ! can_be_root; then
        local why="IDEM_NO_INSTALL=1"
        if [[ ${IDEM_NO_INSTALL:-0} != 1 ]]; then
            why="this needs root, and sudo asks for a password"
            command -v sudo >/dev/null 2>&1 || {
                why="this needs root, and sudo is not installed"
                sudo="as root: "
            }
        fi
        printf 'services.sh: %s is not installed, and this script does not install it (%s).\n  Install it with:\n    %s%s\n  then run this again.\n' \
            "$what" "$why" "$sudo" "$command" >&2
        exit "$EXIT_MISSING"
    fi
    local log=$STATE_DIR/install.log
    say "         installing it now: $sudo$command (log: $log)"
    # shellcheck disable=SC2086 # the package lists are word lists
    if command -v apt-get >/dev/null 2>&1; then
        # A fresh machine may have no package lists yet: update them once if the install fails.
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $apt_packages >>"$log" 2>&1 || {
            say "         (updating the package lists first: ${sudo}apt-get update)"
            as_root apt-get update >>"$log" 2>&1 &&
                as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $apt_packages >>"$log" 2>&1
        } || fail "installing $what failed; the end of $log:
$(tail -n 20 "$log")
  Install it by hand (${sudo}$command), then run this again."
    else
        as_root dnf install -y $dnf_packages >>"$log" 2>&1 || fail "installing $what failed; the end of $log:
$(tail -n 20 "$log")
  Install it by hand (${sudo}$command), then run this again."
    fi
}

# ---------------------------------------------------------------------------------------
# PostgreSQL

PG_DIR=$STATE_DIR/postgres # the private cluster's data directory
PG_BINDIR=""               # where initdb, pg_ctl and postgres are
PG_URL=""                  # the URL of the server in use, once up

# Finds the server programs (initdb, pg_ctl): on PATH, or where the packages of Debian,
# Ubuntu, Fedora, Homebrew or a source build put them; the highest version wins, or
# `prefer` (a major version) when it is there.
find_pg_bindir() { # [prefer]
    local dir candidates=()
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        candidates+=("$(dirname "$(command -v initdb)")")
    fi
    for dir in /usr/lib/postgresql/*/bin /usr/pgsql-*/bin /usr/local/pgsql/bin \
        /opt/homebrew/opt/postgresql@*/bin /usr/local/opt/postgresql@*/bin; do
        [[ -x $dir/initdb && -x $dir/pg_ctl && -x $dir/postgres ]] && candidates+=("$dir")
    done
    ((${#candidates[@]})) || return 1
    if [[ -n ${1:-} ]]; then
        for dir in "${candidates[@]}"; do
            [[ $(pg_major "$dir") == "$1" ]] && {
                printf '%s\n' "$dir"
                return
            }
        done
    fi
    printf '%s\n' "${candidates[@]}" | sort -V | tail -n 1
}

pg_major() { # bindir: the major version of its postgres
    local version
    version=$("$1/postgres" --version 2>/dev/null) || return 1
    [[ $version =~ ([0-9]+)\.[0-9]+ ]] && printf '%s\n' "${BASH_REMATCH[1]}"
}

find_psql() {
    if [[ -n $PG_BINDIR && -x $PG_BINDIR/psql ]]; then
        printf '%s\n' "$PG_BINDIR/psql"
    elif command -v psql >/dev/null 2>&1; then
        command -v psql
    else
        local dir
        dir=$(find_pg_bindir) && [[ -x $dir/psql ]] && printf '%s\n' "$dir/psql"
    fi
}

# The user that the servers which refuse root run as when this script runs as root:
# `postgres` when there is one (the packages create it), `nobody` otherwise.
service_user() {
    if id -u postgres >/dev/null 2>&1; then
        printf 'postgres\n'
    else
        printf 'nobody\n'
    fi
}

owner_of() { # path
    stat -c %U "$1" 2>/dev/null || stat -f %Su "$1"
}

# Runs a PostgreSQL program as the private cluster's owner. PostgreSQL refuses to run as
# root: as root, the owner is the user `postgres` when there is one (the packages create
# it), `nobody` otherwise. From `/`, which every user may enter.
pg_run() {
    run_as_owner_of "$PG_DIR" "$@"
}

# Runs a command as the owner of `dir` when root (see pg_run), as this user otherwise.
run_as_owner_of() { # dir command...
    local dir=$1
    shift
    if [[ $(id -u) -ne 0 ]]; then
        (cd / && "$@")
        return
    fi
    local user
    user=$(owner_of "$dir")
    if command -v runuser >/dev/null 2>&1; then
        (cd / && runuser -u "$user" -- "$@")
    else
        (cd / && su -s /bin/sh "$user" -c 'exec "$@"' sh "$@")
    fi
}

# The port of the private cluster when it runs.
private_pg_port() {
    [[ -f $PG_DIR/postmaster.pid ]] || return 1
    local pid port
    { read -r pid && read -r _ && read -r _ && read -r port; } <"$PG_DIR/postmaster.pid" || return 1
    [[ $pid =~ ^[0-9]+$ && $port =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    grep -q postgres "/proc/$pid/cmdline" 2>/dev/null || [[ ! -d /proc ]] || return 1
    printf '%s\n' "$port"
}

# Whether the server at host/port accepts user/database (password from url_password):
# 0 yes, 1 nothing answers, 2 it answers but refuses (the reason in pg_refusal).
pg_refusal=""
pg_check() { # host port user database
    port_open "$1" "$2" || return 1
    local psql
    # Without a client the answer cannot be checked; a server that listens is taken.
    psql=$(find_psql) || return 0
    if pg_refusal=$(PGCONNECT_TIMEOUT=5 PGPASSWORD=$url_password "$psql" -w -X -A -t -q \
        -h "$1" -p "$2" -U "$3" -d "$4" -c 'SELECT 1' 2>&1 >/dev/null); then
        return 0
    fi
    pg_refusal=$(printf '%s\n' "$pg_refusal" | head -n 3)
    return 2
}

# Creates the URL's role (a superuser) and database in the private cluster when missing.
pg_ensure_role_and_database() { # port user database
    local psql
    psql=$(find_psql) || fail "psql is missing next to the server programs in $PG_BINDIR"
    "$psql" -w -X -q -v ON_ERROR_STOP=1 -v "role=$2" -v "db=$3" -h 127.0.0.1 -p "$1" -U postgres -d postgres \
        >>"$STATE_DIR/postgres.log" 2>&1 <<'SQL' || fail "could not create the role and database of DATABASE_URL in the private cluster; see $STATE_DIR/postgres.log"
SELECT format('CREATE ROLE %I SUPERUSER LOGIN', :'role')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'role')
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec
SQL
}

# The server programs, installed when missing; sets PG_BINDIR. Returns 1 right after an
# install (the packages may have started a server of their own: look again).
ensure_pg_binaries() {
    local prefer=""
    [[ -f $PG_DIR/PG_VERSION ]] && prefer=$(cat "$PG_DIR/PG_VERSION")
    PG_BINDIR=$(find_pg_bindir "$prefer") && return 0
    say "postgres: the server programs (initdb, pg_ctl, postgres) are not installed"
    install_packages "PostgreSQL's server" postgresql postgresql-server \
        "macOS: brew install postgresql@17; Arch: pacman -S postgresql; Alpine: apk add postgresql"
    PG_BINDIR=$(find_pg_bindir "$prefer") ||
        fail "PostgreSQL was installed but initdb and pg_ctl are not on PATH nor in /usr/lib/postgresql/*/bin; put their folder on PATH"
    say "postgres: installed ($PG_BINDIR)"
    return 1
}

start_private_postgres() { # port listen-address
    local port=$1 listen=$2
    if [[ ! -f $PG_DIR/PG_VERSION ]]; then
        rm -rf "$PG_DIR"
        mkdir -p "$PG_DIR"
        if [[ $(id -u) -eq 0 ]]; then
            local user
            user=$(service_user)
            chown "$user" "$PG_DIR"
            pg_run test -w "$PG_DIR" || fail "the private cluster runs as the user '$user' (PostgreSQL refuses root), and '$user' cannot reach $PG_DIR.
  Point IDEM_SERVICES_DIR at a folder every user can enter, e.g.: export IDEM_SERVICES_DIR=/tmp/idem-services"
        fi
        say "postgres: creating a private cluster in $PG_DIR (initdb; trust authentication, loopback only)"
        pg_run "$PG_BINDIR/initdb" -D "$PG_DIR" -U postgres --auth=trust --encoding=UTF8 --no-locale \
            >>"$STATE_DIR/postgres.log" 2>&1 || fail "initdb failed; the end of $STATE_DIR/postgres.log:
$(tail -n 20 "$STATE_DIR/postgres.log")"
        printf '%s\n' "# idem's private cluster (scripts/services.sh): TCP on loopback only (listen_addresses and port are given at start)" \
            "unix_socket_directories = ''" >>"$PG_DIR/postgresql.conf"
    else
        local version
        version=$(pg_major "$PG_BINDIR")
        [[ $version == "$(cat "$PG_DIR/PG_VERSION")" ]] || fail "the private cluster in $PG_DIR is of PostgreSQL $(cat "$PG_DIR/PG_VERSION"), and only PostgreSQL $version is installed.
  It holds only what the tests and the demo wrote; remove it with: rm -rf $PG_DIR"
    fi
    say "postgres: starting the private cluster on $listen:$port (log: $STATE_DIR/postgres.log)"
    # The server must not inherit the lock (fd 8): it would hold it after this script ends.
    pg_run "$PG_BINDIR/pg_ctl" start -D "$PG_DIR" -w -t 60 -o "-p $port -c listen_addresses=$listen" \
        >>"$STATE_DIR/postgres.log" 2>&1 8>&- || fail "the private cluster did not start; the end of $STATE_DIR/postgres.log:
$(tail -n 20 "$STATE_DIR/postgres.log")"
    printf '%s\n' "$PG_BINDIR" >"$STATE_DIR/postgres.private"
}

# A note when the Debian cluster on that port exists but is stopped.
note_stopped_system_cluster() { # port
    command -v pg_lsclusters >/dev/null 2>&1 || return 0
    local version name port status _
    while read -r version name port status _; do
        if [[ $port == "$1" && $status == down* ]]; then
            say "postgres: note: the system cluster $version/$name (port $port) is stopped; this script runs its own instead."
            say "          To use the system one, stop this one (scripts/services.sh down), then start it with"
            say "          sudo pg_ctlcluster $version $name start (it must accept DATABASE_URL's user without a password)"
        fi
    done < <(pg_lsclusters --no-header 2>/dev/null || true)
}

start_postgres() {
    parse_url "$DATABASE_URL" 5432
    local host=$url_host port=$url_port user=${url_user:-postgres} database=$url_path
    [[ -n $database ]] || database=$user
    # One start at a time, even when several scripts start together.
    exec 8>"$STATE_DIR/postgres.lock"
    flock 8

    local running listen=127.0.0.1
    [[ $host == localhost || $host == ::1 ]] && listen=$host
    if running=$(private_pg_port); then
        if [[ -z $DATABASE_URL_GIVEN ]] || { is_loopback "$host" && [[ $running == "$port" ]]; }; then
            PG_BINDIR=$(cat "$STATE_DIR/postgres.private" 2>/dev/null || find_pg_bindir || true)
            if [[ -n $DATABASE_URL_GIVEN ]]; then
                PG_URL=$DATABASE_URL
            else
                PG_URL=postgres://postgres@127.0.0.1:$running/postgres
            fi
            pg_ensure_role_and_database "$running" "$user" "$database"
            say "postgres: private cluster running at 127.0.0.1:$running (reused; data in $PG_DIR)"
            flock -u 8
            return
        fi
    fi

    local status=0
    pg_check "$host" "$port" "$user" "$database" || status=$?
    case $status in
    0)
        PG_URL=$DATABASE_URL
        say "postgres: running at $host:$port (reused)"
        flock -u 8
        return
        ;;
    2)
        [[ -z $DATABASE_URL_GIVEN ]] || fail "PostgreSQL at $host:$port answers but refuses DATABASE_URL's connection:
$(printf '%s\n' "$pg_refusal" | sed 's/^/    /')
  Fix the user, password or database in DATABASE_URL, point DATABASE_URL at another server,
  or unset DATABASE_URL to let this script run a private cluster (in $PG_DIR)."
        say "postgres: the server at $host:$port refuses user postgres without a password:"
        say "$(printf '%s\n' "$pg_refusal" | head -n 1 | sed 's/^/            /')"
        port=$(free_port 5433)
        say "          so this script runs a private cluster on port $port instead (or set DATABASE_URL to a URL that server accepts)"
        ;;
    1)
        is_loopback "$host" || fail "PostgreSQL does not answer at $host:$port (from DATABASE_URL); start it there, or unset DATABASE_URL to let this script run a private cluster on loopback"
        note_stopped_system_cluster "$port"
        ;;
    esac
    if [[ -n $running ]]; then
        fail "the private cluster of $STATE_DIR runs on port $running, not on port $port of DATABASE_URL.
  Use it (export DATABASE_URL=postgres://postgres@127.0.0.1:$running/postgres), or stop it first: scripts/services.sh down"
    fi
    if ! ensure_pg_binaries; then
        # The packages may have started a server of their own: look again.
        [[ -z ${PG_RETRIED:-} ]] || fail "PostgreSQL was installed but is still not found"
        PG_RETRIED=1
        flock -u 8
        start_postgres
        return
    fi
    start_private_postgres "$port" "$listen"
    pg_ensure_role_and_database "$port" "$user" "$database"
    if [[ -n $DATABASE_URL_GIVEN ]]; then
        PG_URL=$DATABASE_URL
    else
        PG_URL=postgres://postgres@127.0.0.1:$port/postgres
    fi
    say "postgres: private cluster running at $listen:$port (started; data in $PG_DIR)"
    if [[ $PG_URL != "$DATABASE_URL" ]] && ((!PRINT_ENV)); then
        say "          the tests and examples reach it with: export DATABASE_URL=$PG_URL"
    fi
    flock -u 8
}

stop_postgres() {
    local stopped=1 port
    if port=$(private_pg_port); then
        PG_BINDIR=$(cat "$STATE_DIR/postgres.private" 2>/dev/null || true)
        [[ -x $PG_BINDIR/pg_ctl ]] || PG_BINDIR=$(find_pg_bindir "$(cat "$PG_DIR/PG_VERSION")") ||
            fail "the private cluster runs on port $port, but pg_ctl is not found to stop it"
        pg_run "$PG_BINDIR/pg_ctl" stop -D "$PG_DIR" -m fast -w -t 60 >>"$STATE_DIR/postgres.log" 2>&1 ||
            fail "pg_ctl could not stop the private cluster; see $STATE_DIR/postgres.log"
        say "postgres: stopped the private cluster on port $port (data kept in $PG_DIR)"
        stopped=0
    fi
    rm -f "$STATE_DIR/postgres.private"
    # A system cluster started by an earlier version of this script.
    if [[ -f $STATE_DIR/postgres.started ]]; then
        local version
        version=$(cat "$STATE_DIR/postgres.started")
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main stop && say "postgres: stopped cluster $version/main"
        rm -f "$STATE_DIR/postgres.started"
        stopped=0
    fi
    return "$stopped"
}

# ---------------------------------------------------------------------------------------
# PgBouncer

# Two private instances in front of the PostgreSQL in use (PG_URL): one per pool mode, each
# in $STATE_DIR/pgbouncer-<mode> with its ini, userlist, pid file and log.
PGB_MODES=(session transaction)
PGB_SESSION_URL=""     # the URL through the session pooler, once up
PGB_TRANSACTION_URL="" # the URL through the transaction pooler, once up
PGB_BIN=""

find_pgbouncer() {
    if command -v pgbouncer >/dev/null 2>&1; then
        command -v pgbouncer
    elif [[ -x /usr/sbin/pgbouncer ]]; then # Debian's package; /usr/sbin is not on every PATH
        printf '%s\n' /usr/sbin/pgbouncer
    else
        return 1
    fi
}

pgb_env_name() { # mode: the variable that --print-env exports
    case $1 in
    session) printf 'IDEM_PGBOUNCER_SESSION_URL\n' ;;
    transaction) printf 'IDEM_PGBOUNCER_TRANSACTION_URL\n' ;;
    esac
}

pgb_set_url() { # mode url
    case $1 in
    session) PGB_SESSION_URL=$2 ;;
    transaction) PGB_TRANSACTION_URL=$2 ;;
    esac
}

pgb_dir() { # mode
    printf '%s\n' "$STATE_DIR/pgbouncer-$1"
}

# The pid of the instance of `mode` that this script started, when it runs.
pgb_pid() { # mode
    local dir pid
    dir=$(pgb_dir "$1")
    pid=$(cat "$dir/pgbouncer.pid" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    # Its command line names its ini (a pid reused by another program does not).
    [[ ! -d /proc ]] || grep -qaF -- "$dir/pgbouncer.ini" "/proc/$pid/cmdline" 2>/dev/null || return 1
    printf '%s\n' "$pid"
}

pgb_port() { # mode: the listen_port of its ini
    local line
    line=$(grep -m 1 '^listen_port = ' "$(pgb_dir "$1")/pgbouncer.ini" 2>/dev/null) || return 1
    printf '%s\n' "${line#listen_port = }"
}

# The ini of the instance of `mode` on `port` in front of host:port, for admin user `user`.
pgb_ini() { # mode port backend-host backend-port user
    local dir
    dir=$(pgb_dir "$1")
    cat <<INI
; idem's private PgBouncer (scripts/services.sh), pool_mode $1: written at each start
[databases]
; Any database name goes to the same server (the tests create a database per test).
* = host=$3 port=$4

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $2
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = $5
pool_mode = $1
max_client_conn = 500
default_pool_size = 8
; sqlx sends extra_float_digits when it connects
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
}

pgb_userlist() { # user password: the user (auth_type trust still looks it up there)
    local user=${1//\"/\"\"} password=${2//\"/\"\"}
    printf '"%s" "%s"\n' "$user" "$password"
}

# Whether the instance on `port` passes `SELECT 1` to the server (a listening port when
# psql is missing); the client's error in pgb_refusal otherwise.
pgb_check() { # port user database
    port_open 127.0.0.1 "$1" || {
        pgb_refusal="nothing listens on 127.0.0.1:$1"
        return 1
    }
    local psql
    psql=$(find_psql) || return 0
    pgb_refusal=$(PGCONNECT_TIMEOUT=5 "$psql" -w -X -A -t -q -h 127.0.0.1 -p "$1" -U "$2" -d "$3" \
        -c 'SELECT 1' 2>&1 >/dev/null) && return 0
    pgb_refusal=$(printf '%s\n' "$pgb_refusal" | head -n 3)
    return 1
}

stop_pgbouncer_instance() { # mode
    local pid
    pid=$(pgb_pid "$1") || {
        rm -f "$(pgb_dir "$1")/pgbouncer.pid"
        return 1
    }
    # SIGTERM: immediate shutdown (SIGINT would wait for the clients' transactions).
    kill -TERM "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || fail "pgbouncer (pool_mode $1, pid $pid) did not stop within 10 s"
    rm -f "$(pgb_dir "$1")/pgbouncer.pid"
    say "pgbouncer: stopped the $1 pooler (pid $pid)"
}

ensure_pgbouncer_binary() { # sets PGB_BIN
    PGB_BIN=$(find_pgbouncer) && return 0
    say "pgbouncer: pgbouncer is not installed"
    install_packages "PgBouncer (pgbouncer)" pgbouncer pgbouncer \
        "macOS: brew install pgbouncer; Arch: pacman -S pgbouncer; Alpine: apk add pgbouncer"
    PGB_BIN=$(find_pgbouncer) || fail "PgBouncer was installed but pgbouncer is not on PATH nor in /usr/sbin"
    say "pgbouncer: installed ($PGB_BIN)"
}

# One instance of `mode` in front of the PostgreSQL at PG_URL: reused when it runs with the
# same settings (same server, user and password), restarted when they changed.
start_pgbouncer_instance() { # mode
    local mode=$1 dir port="" pid ini userlist
    dir=$(pgb_dir "$mode")
    parse_url "$PG_URL" 5432
    local host=$url_host backend_port=$url_port user=${url_user:-postgres} password=$url_password database=$url_path
    [[ -n $database ]] || database=$user
    # The URL through the instance: PG_URL's user, password and database, without its
    # query (PgBouncer's clients here speak plain TCP).
    local rest=${PG_URL#*://} authority userinfo="" path="" url
    authority=${rest%%[/?]*}
    [[ $authority == *@* ]] && userinfo=${authority%@*}@
    rest=${rest:${#authority}}
    rest=${rest%%\?*}
    [[ $rest == /* ]] && path=$rest
    url=postgres://${userinfo}127.0.0.1

    userlist=$(pgb_userlist "$user" "$password")
    if pid=$(pgb_pid "$mode"); then
        port=$(pgb_port "$mode")
        ini=$(pgb_ini "$mode" "$port" "$host" "$backend_port" "$user")
        if [[ $ini == "$(cat "$dir/pgbouncer.ini")" && $userlist == "$(cat "$dir/userlist.txt" 2>/dev/null)" ]] &&
            pgb_check "$port" "$user" "$database"; then
            pgb_set_url "$mode" "$url:$port$path"
            say "pgbouncer: $mode pooler running at 127.0.0.1:$port in front of $host:$backend_port (reused; started by this script)"
            return
        fi
        local before
        before=$(sed -n 's/^\* = host=\(.*\) port=\(.*\)$/\1:\2/p' "$dir/pgbouncer.ini")
        if [[ $before != "$host:$backend_port" ]]; then
            say "pgbouncer: the $mode pooler at 127.0.0.1:$port stands in front of $before, and the PostgreSQL in use is $host:$backend_port: restarting it"
        elif [[ $ini != "$(cat "$dir/pgbouncer.ini")" || $userlist != "$(cat "$dir/userlist.txt" 2>/dev/null)" ]]; then
            say "pgbouncer: the $mode pooler at 127.0.0.1:$port runs with other settings (user, password or this script's): restarting it"
        else
            say "pgbouncer: the $mode pooler at 127.0.0.1:$port does not pass 'SELECT 1' to $host:$backend_port: restarting it"
            say "$(printf '%s\n' "$pgb_refusal" | head -n 1 | sed 's/^/           /')"
        fi
        stop_pgbouncer_instance "$mode" || true
    else
        port=$(pgb_port "$mode" || true)
    fi
    # The port of an earlier run when it is free, the next free one from 6432 otherwise
    # (past the other mode's port, which may not listen yet).
    if [[ -z $port ]] || port_open 127.0.0.1 "$port" || [[ $port == "${PGB_TAKEN_PORT:-}" ]]; then
        port=$(free_port 6432)
        [[ $port != "${PGB_TAKEN_PORT:-}" ]] || port=$(free_port $((port + 1)))
    fi

    rm -rf "$dir"
    mkdir -p "$dir"
    pgb_ini "$mode" "$port" "$host" "$backend_port" "$user" >"$dir/pgbouncer.ini"
    (umask 077 && printf '%s\n' "$userlist" >"$dir/userlist.txt")
    : >>"$dir/pgbouncer.log"
    if [[ $(id -u) -eq 0 ]]; then
        # PgBouncer refuses to run as root.
        local owner
        owner=$(service_user)
        chown -R "$owner" "$dir"
        run_as_owner_of "$dir" test -w "$dir" -a -r "$dir/userlist.txt" || fail "PgBouncer runs as the user '$owner' (it refuses root), and '$owner' cannot reach $dir.
  Point IDEM_SERVICES_DIR at a folder every user can enter, e.g.: export IDEM_SERVICES_DIR=/tmp/idem-services"
    fi
    say "pgbouncer: starting the $mode pooler on 127.0.0.1:$port in front of $host:$backend_port (log: $dir/pgbouncer.log)"
    # -d: it daemonizes once its port listens. It must not inherit the scripts' locks.
    run_as_owner_of "$dir" "$PGB_BIN" -d "$dir/pgbouncer.ini" >>"$dir/pgbouncer.log" 2>&1 6>&- 7>&- 8>&- 9>&- ||
        fail "pgbouncer ($mode pooler) did not start; the end of $dir/pgbouncer.log:
$(tail -n 20 "$dir/pgbouncer.log")"
    # The daemon writes its pid file a moment after the command returns; it removes it
    # when it ends (a port it cannot take, say).
    local deadline=$((SECONDS + 15)) pidfile_by=$((SECONDS + 3))
    until pgb_check "$port" "$user" "$database"; do
        if ((SECONDS >= deadline)) || { [[ -f $dir/pgbouncer.pid ]] && ! pgb_pid "$mode" >/dev/null; } ||
            { ((SECONDS >= pidfile_by)) && [[ ! -f $dir/pgbouncer.pid ]]; }; then
            stop_pgbouncer_instance "$mode" >/dev/null || true
            fail "pgbouncer ($mode pooler on 127.0.0.1:$port) does not pass 'SELECT 1' to $host:$backend_port:
$(printf '%s\n' "$pgb_refusal" | sed 's/^/    /')
  The end of $dir/pgbouncer.log:
$(tail -n 20 "$dir/pgbouncer.log")"
        fi
        sleep 0.1
    done
    PGB_TAKEN_PORT=$port
    pgb_set_url "$mode" "$url:$port$path"
    say "pgbouncer: $mode pooler running at 127.0.0.1:$port in front of $host:$backend_port (started; pid $(pgb_pid "$mode"))"
    ((PRINT_ENV)) || say "           the tests reach it with: export $(pgb_env_name "$mode")=$url:$port$path"
}

start_pgbouncer() {
    [[ -n $PG_URL ]] || fail "pgbouncer needs the PostgreSQL in use; start postgres first"
    exec 6>"$STATE_DIR/pgbouncer.lock"
    flock 6
    ensure_pgbouncer_binary
    PGB_TAKEN_PORT=""
    local mode
    for mode in "${PGB_MODES[@]}"; do
        # The other mode's port when it runs (reused) is taken too.
        start_pgbouncer_instance "$mode"
        PGB_TAKEN_PORT=$(pgb_port "$mode")
    done
    flock -u 6
    exec 6>&-
}

stop_pgbouncer() { # status 0 when it stopped one
    local mode stopped=1
    for mode in "${PGB_MODES[@]}"; do
        stop_pgbouncer_instance "$mode" && stopped=0
    done
    return "$stopped"
}

# ---------------------------------------------------------------------------------------
# Redis

REDIS_OUT_URL="" # the URL of the Redis in use, once up

# The first line of the server's answer to PING (after AUTH when the URL has a password);
# status 1 when nothing listens.
redis_ping() { # host port
    (
        exec 3<>"/dev/tcp/$1/$2" || exit 1
        line=""
        if [[ -n $url_password ]]; then
            printf 'AUTH %s\r\n' "${url_user:+$url_user }$url_password" >&3
            IFS= read -r -t 3 line <&3 || true
        fi
        printf 'PING\r\n' >&3
        IFS= read -r -t 3 line <&3 || line=""
        printf '%s\n' "${line%$'\r'}"
    ) 2>/dev/null
}

private_redis_port() { # the port of the Redis this script started, when it runs
    [[ -f $STATE_DIR/redis.started ]] || return 1
    local pid port
    pid=$(cat "$STATE_DIR/redis.pid" 2>/dev/null) || return 1
    port=$(cat "$STATE_DIR/redis.started")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    [[ $port =~ ^[0-9]+$ ]] || port=${REDIS_PORT:-6379} # a marker of an earlier version
    printf '%s\n' "$port"
}

start_redis() {
    parse_url "$REDIS_URL" 6379
    local host=$url_host port=$url_port running="" scheme=${REDIS_URL%%://*}
    exec 7>"$STATE_DIR/redis.lock"
    flock 7
    if running=$(private_redis_port); then
        if [[ -z $REDIS_URL_GIVEN ]] || { is_loopback "$host" && [[ $running == "$port" ]]; }; then
            REDIS_OUT_URL=$REDIS_URL
            [[ -n $REDIS_URL_GIVEN ]] || REDIS_OUT_URL=redis://127.0.0.1:$running
            say "redis: running at 127.0.0.1:$running (reused; started by this script)"
            flock -u 7
            return
        fi
    fi
    local reply status=0
    reply=$(redis_ping "$host" "$port") || status=1
    if ((status == 0)); then
        if [[ $reply == +PONG ]]; then
            REDIS_OUT_URL=$REDIS_URL
            say "redis: running at $host:$port (reused)"
            flock -u 7
            return
        fi
        [[ -z $REDIS_URL_GIVEN ]] || fail "the server at $host:$port (REDIS_URL) does not accept Redis's PING; it answers: ${reply:-nothing}
  Fix REDIS_URL (a password goes in as redis://:PASSWORD@$host:$port), point it at another server,
  or unset REDIS_URL and REDIS_PORT to let this script run a private Redis."
        say "redis: the server at $host:$port does not accept PING without a password (it answers: ${reply:-nothing});"
        port=$(free_port 6380)
        say "       this script runs a private Redis on port $port instead (or set REDIS_URL to a URL that server accepts)"
    else
        [[ $scheme == redis ]] || fail "Redis does not answer at $host:$port (from REDIS_URL), and this script starts only plain redis:// servers"
        is_loopback "$host" || fail "Redis does not answer at $host:$port (from REDIS_URL); start it there, or unset REDIS_URL to let this script run a private one on loopback"
    fi
    if [[ -n $running ]]; then
        fail "the Redis this script started runs on port $running, not on port $port of REDIS_URL.
  Use it (export REDIS_URL=redis://127.0.0.1:$running), or stop it first: scripts/services.sh down"
    fi
    if ! command -v redis-server >/dev/null 2>&1; then
        say "redis: redis-server is not installed"
        install_packages "Redis's server (redis-server)" redis-server redis "macOS: brew install redis; Arch: pacman -S redis; Alpine: apk add redis"
        command -v redis-server >/dev/null 2>&1 || fail "Redis was installed but redis-server is not on PATH"
        say "redis: installed ($(command -v redis-server))"
        # The package may have started a server of its own: look again.
        if [[ -z $REDIS_URL_GIVEN ]] && [[ $(redis_ping 127.0.0.1 6379 || true) == +PONG ]]; then
            REDIS_OUT_URL=redis://127.0.0.1:6379
            say "redis: running at 127.0.0.1:6379 (reused; started by the package)"
            flock -u 7
            return
        fi
    fi
    local password=()
    if [[ -n $url_password && -n $REDIS_URL_GIVEN ]]; then
        password=(--requirepass "$url_password")
    fi
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$port" --save "" --appendonly no \
        --dir "$STATE_DIR" --pidfile "$STATE_DIR/redis.pid" --logfile "$STATE_DIR/redis.log" \
        ${password[@]+"${password[@]}"} >/dev/null 7>&- ||
        fail "redis-server did not start; see $STATE_DIR/redis.log"
    local deadline=$((SECONDS + 10))
    until [[ $(redis_ping 127.0.0.1 "$port" || true) == +PONG ]]; do
        ((SECONDS < deadline)) || fail "redis-server did not start; the end of $STATE_DIR/redis.log:
$(tail -n 20 "$STATE_DIR/redis.log")"
        sleep 0.1
    done
    printf '%s\n' "$port" >"$STATE_DIR/redis.started"
    REDIS_OUT_URL=$REDIS_URL
    [[ -n $REDIS_URL_GIVEN ]] || REDIS_OUT_URL=redis://127.0.0.1:$port
    say "redis: running at 127.0.0.1:$port (started; pid $(cat "$STATE_DIR/redis.pid"))"
    if [[ $REDIS_OUT_URL != "$REDIS_URL" ]] && ((!PRINT_ENV)); then
        say "       the tests reach it with: export REDIS_URL=$REDIS_OUT_URL"
    fi
    flock -u 7
}

# ---------------------------------------------------------------------------------------
# Kafka (tansu)

find_tansu() {
    if command -v tansu >/dev/null 2>&1; then
        command -v tansu
    elif [[ -x ${CARGO_HOME:-$HOME/.cargo}/bin/tansu ]]; then
        printf '%s\n' "${CARGO_HOME:-$HOME/.cargo}/bin/tansu"
    else
        return 1
    fi
}

install_tansu() {
    [[ ${IDEM_NO_INSTALL:-0} == 1 ]] && fail "tansu (the Kafka-API broker) is not installed; install it with: $TANSU_INSTALL"
    command -v cargo >/dev/null 2>&1 || fail "tansu is not installed and cargo is missing; install Rust (https://rustup.rs), then: $TANSU_INSTALL"
    say "kafka: the tansu broker is not installed; installing it now with"
    say "         $TANSU_INSTALL"
    say "       The first time, this takes about 12 minutes on 2 cores (log: $STATE_DIR/tansu-install.log)."
    # One install at a time, even when several scripts start together.
    exec 9>"$STATE_DIR/tansu-install.lock"
    flock 9
    if ! find_tansu >/dev/null; then
        $TANSU_INSTALL >"$STATE_DIR/tansu-install.log" 2>&1 ||
            fail "installing tansu failed; the end of $STATE_DIR/tansu-install.log:
$(tail -n 20 "$STATE_DIR/tansu-install.log")"
    fi
    flock -u 9
}

# The pid of the tansu this script started, when it still runs; nothing otherwise.
own_tansu() {
    local pid
    pid=$(cat "$STATE_DIR/tansu.pid" 2>/dev/null || true)
    if [[ -f $STATE_DIR/kafka.started && -n $pid ]] && grep -q tansu "/proc/$pid/cmdline" 2>/dev/null; then
        printf '%s\n' "$pid"
    fi
}

start_kafka() {
    if port_open 127.0.0.1 "$KAFKA_PORT"; then
        local own
        own=$(own_tansu)
        if [[ ${IDEM_KAFKA_FRESH:-0} != 1 || -z $own ]]; then
            say "kafka: a broker is running at 127.0.0.1:$KAFKA_PORT (reused)"
            return
        fi
        # A test run starts on empty storage: the sqlite storage of a broker that served
        # many runs grows, and its requests slow down (the tests' topics are their own).
        kill "$own"
        wait_gone "$own" 30 || fail "tansu (pid $own) did not stop within 30 s"
        wait_port_closed 127.0.0.1 "$KAFKA_PORT" 30 || fail "port $KAFKA_PORT stayed taken after tansu stopped"
        rm -f "$STATE_DIR/kafka.started" "$STATE_DIR/tansu.pid" "$STATE_DIR"/tansu/tansu.db*
        say "kafka: stopped tansu (pid $own) to start it again on empty storage"
    fi
    local tansu
    tansu=$(find_tansu) || {
        install_tansu
        tansu=$(find_tansu) || fail "tansu was installed but is not on PATH nor in ${CARGO_HOME:-$HOME/.cargo}/bin"
    }
    # The sqlite storage engine (the in-memory one loses records when a consumer resumes
    # inside a multi-record batch). Its path is relative to the working directory.
    mkdir -p "$STATE_DIR/tansu"
    (
        cd "$STATE_DIR/tansu"
        exec setsid "$tansu" broker \
            --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
            --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
            --storage-engine "sqlite://tansu.db" \
            </dev/null >>"$STATE_DIR/tansu.log" 2>&1 7>&- 8>&- 9>&-
    ) &
    local pid=$!
    printf '%s\n' "$pid" >"$STATE_DIR/tansu.pid"
    if ! wait_port 127.0.0.1 "$KAFKA_PORT" 30; then
        kill "$pid" 2>/dev/null || true
        rm -f "$STATE_DIR/tansu.pid"
        fail "tansu did not start; the end of $STATE_DIR/tansu.log:
$(tail -n 20 "$STATE_DIR/tansu.log")"
    fi
    touch "$STATE_DIR/kafka.started"
    say "kafka: tansu running at 127.0.0.1:$KAFKA_PORT (started; pid $pid, storage $STATE_DIR/tansu/tansu.db)"
}

# ---------------------------------------------------------------------------------------
# Prometheus

# A private Prometheus server (Debian's package `prometheus`, which brings `promtool`) in
# $STATE_DIR/prometheus: its own configuration, data directory, pid file and log, on
# loopback, scraping every second the targets listed in its targets.json (file-based
# discovery: rewritten from PROMETHEUS_TARGETS at each `up`, re-read by the server within
# a second) and loading the rule files of PROMETHEUS_RULES. The package's own service,
# which installing the package may start, is stopped and disabled: it would hold port 9090.
PROM_DIR=$STATE_DIR/prometheus
PROM_BIN=""
PROMTOOL_BIN=""
PROM_URL="" # the private server's URL, once up

find_prometheus_tools() { # sets PROM_BIN and PROMTOOL_BIN
    PROM_BIN=$(command -v prometheus 2>/dev/null) || return 1
    PROMTOOL_BIN=$(command -v promtool 2>/dev/null) || return 1
}

# The package's service, started by the install: stopped and kept from starting at boot.
stop_package_prometheus() {
    local log=$STATE_DIR/install.log
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        as_root systemctl disable --now prometheus >>"$log" 2>&1 || true
    elif [[ -x /etc/init.d/prometheus ]]; then
        as_root /etc/init.d/prometheus stop >>"$log" 2>&1 || true
        if command -v update-rc.d >/dev/null 2>&1; then
            as_root update-rc.d prometheus disable >>"$log" 2>&1 || true
        fi
    fi
}

ensure_prometheus_binaries() {
    find_prometheus_tools && return 0
    say "prometheus: prometheus and promtool are not installed"
    install_packages "Prometheus (prometheus, promtool)" prometheus golang-github-prometheus \
        "macOS: brew install prometheus; Arch: pacman -S prometheus; Alpine: apk add prometheus"
    find_prometheus_tools || fail "Prometheus was installed but prometheus and promtool are not on PATH"
    stop_package_prometheus
    say "prometheus: installed ($PROM_BIN, $PROMTOOL_BIN; the package's own service stopped and disabled)"
}

# The pid of the private server, when it runs.
prometheus_pid() {
    local pid
    pid=$(cat "$PROM_DIR/prometheus.pid" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] && still_runs "$pid" || return 1
    # Its command line names its configuration (a pid reused by another program does not).
    [[ ! -d /proc ]] || grep -qaF -- "$PROM_DIR/prometheus.yml" "/proc/$pid/cmdline" 2>/dev/null || return 1
    printf '%s\n' "$pid"
}

# The HTTP status of GET `path` at 127.0.0.1:`port` (status 1 when nothing answers).
http_status() { # port path
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
        line=""
        IFS= read -r -t 3 line <&3 || exit 1
        line=${line#* }
        printf '%s\n' "${line%% *}"
    ) 2>/dev/null
}

prometheus_config() { # the configuration, from PROMETHEUS_RULES
    local rules=() file
    if [[ -n ${PROMETHEUS_RULES:-} ]]; then
        IFS=, read -r -a rules <<<"$PROMETHEUS_RULES"
    fi
    printf '%s\n' "# idem's private Prometheus (scripts/services.sh): written at each start" \
        "global:" "  scrape_interval: 1s" "  scrape_timeout: 1s" "  evaluation_interval: 1s"
    if ((${#rules[@]})); then
        printf '%s\n' "rule_files:"
        for file in "${rules[@]}"; do
            [[ -f $file ]] || fail "the rule file $file (PROMETHEUS_RULES) does not exist"
            printf '  - "%s"\n' "$(cd "$(dirname "$file")" && pwd)/$(basename "$file")"
        done
    fi
    printf '%s\n' "scrape_configs:" "  - job_name: idem" "    file_sd_configs:" \
        "      - files: [\"$PROM_DIR/targets.json\"]" "        refresh_interval: 1s"
}

prometheus_targets() { # the targets file, from PROMETHEUS_TARGETS (host:port,...)
    local targets=() target list=""
    if [[ -n ${PROMETHEUS_TARGETS:-} ]]; then
        IFS=, read -r -a targets <<<"$PROMETHEUS_TARGETS"
    fi
    local pattern='^[][A-Za-z0-9.:_-]+:[0-9]+$' # host:port, [IPv6]:port
    for target in "${targets[@]+"${targets[@]}"}"; do
        [[ $target =~ $pattern ]] || fail "'$target' in PROMETHEUS_TARGETS is not a host:port"
        list+="${list:+, }\"$target\""
    done
    printf '[{"targets": [%s], "labels": {}}]\n' "$list"
}

start_prometheus() {
    mkdir -p "$PROM_DIR"
    exec 5>"$STATE_DIR/prometheus.lock"
    flock 5
    ensure_prometheus_binaries
    local config pid port
    config=$(prometheus_config)
    # Written first: a running server re-reads it within a second.
    prometheus_targets >"$PROM_DIR/targets.json.new"
    mv "$PROM_DIR/targets.json.new" "$PROM_DIR/targets.json"
    if pid=$(prometheus_pid); then
        port=$(cat "$PROM_DIR/port")
        if [[ $config != "$(cat "$PROM_DIR/prometheus.yml")" ]]; then
            printf '%s\n' "$config" >"$PROM_DIR/prometheus.yml"
            kill -HUP "$pid"
            say "prometheus: running at 127.0.0.1:$port (reused; started by this script; its rule files changed: reloaded)"
        else
            say "prometheus: running at 127.0.0.1:$port (reused; started by this script)"
        fi
    else
        printf '%s\n' "$config" >"$PROM_DIR/prometheus.yml"
        port=$(free_port "${PROMETHEUS_PORT:-9090}")
        say "prometheus: starting a private server on 127.0.0.1:$port (data in $PROM_DIR/data, log: $PROM_DIR/prometheus.log)"
        (
            exec setsid "$PROM_BIN" --config.file="$PROM_DIR/prometheus.yml" \
                --storage.tsdb.path="$PROM_DIR/data" --storage.tsdb.retention.time=1d \
                --web.listen-address="127.0.0.1:$port" \
                </dev/null >>"$PROM_DIR/prometheus.log" 2>&1 5>&- 6>&- 7>&- 8>&- 9>&-
        ) &
        pid=$!
        printf '%s\n' "$pid" >"$PROM_DIR/prometheus.pid"
        printf '%s\n' "$port" >"$PROM_DIR/port"
        local deadline=$((SECONDS + 60))
        until [[ $(http_status "$port" /-/ready || true) == 200 ]]; do
            if ((SECONDS >= deadline)) || ! still_runs "$pid"; then
                kill "$pid" 2>/dev/null || true
                rm -f "$PROM_DIR/prometheus.pid"
                fail "prometheus did not start; the end of $PROM_DIR/prometheus.log:
$(tail -n 20 "$PROM_DIR/prometheus.log")"
            fi
            sleep 0.2
        done
        say "prometheus: running at 127.0.0.1:$port (started; pid $pid)"
    fi
    PROM_URL=http://127.0.0.1:$port
    flock -u 5
    exec 5>&-
}

stop_prometheus() { # status 0 when it stopped one
    local pid
    pid=$(prometheus_pid) || {
        rm -f "$PROM_DIR/prometheus.pid"
        return 1
    }
    kill "$pid" 2>/dev/null || true
    wait_gone "$pid" 30 || fail "prometheus (pid $pid) did not stop within 30 s"
    rm -f "$PROM_DIR/prometheus.pid"
    say "prometheus: stopped (pid $pid)"
}

# ---------------------------------------------------------------------------------------

# Whether process `pid` still runs: a zombie does not (a daemon's zombie waits for init,
# which may reap it only a second or two later).
still_runs() { # pid
    kill -0 "$1" 2>/dev/null || return 1
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    [[ ${stat:0:1} != Z ]]
}

wait_gone() { # pid seconds
    local deadline=$((SECONDS + $2))
    while still_runs "$1"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

stop_started() {
    local stopped=0
    if [[ -f $STATE_DIR/kafka.started ]]; then
        local pid
        pid=$(cat "$STATE_DIR/tansu.pid" 2>/dev/null || true)
        if [[ -n $pid ]] && grep -q tansu "/proc/$pid/cmdline" 2>/dev/null; then
            kill "$pid"
            say "kafka: stopped tansu (pid $pid)"
        fi
        rm -f "$STATE_DIR/kafka.started" "$STATE_DIR/tansu.pid"
        stopped=1
    fi
    if [[ -f $STATE_DIR/redis.started ]]; then
        local pid
        pid=$(cat "$STATE_DIR/redis.pid" 2>/dev/null || true)
        if [[ -n $pid ]] && grep -q redis "/proc/$pid/cmdline" 2>/dev/null; then
            kill "$pid"
            wait_gone "$pid" 10 || fail "redis-server (pid $pid) did not stop within 10 s"
            say "redis: stopped (pid $pid)"
        fi
        rm -f "$STATE_DIR/redis.started"
        stopped=1
    fi
    stop_pgbouncer && stopped=1
    stop_prometheus && stopped=1
    stop_postgres && stopped=1
    ((stopped)) || say "nothing to stop: this script started no service that still runs"
}

status() {
    local port state
    parse_url "$DATABASE_URL" 5432
    if port=$(private_pg_port); then
        printf '%-10s %s  %s\n' "postgres:" "127.0.0.1:$port" "running (private cluster in $PG_DIR, started by this script)"
    else
        state="not running"
        case $(pg_check "$url_host" "$url_port" "${url_user:-postgres}" "${url_path:-${url_user:-postgres}}" && echo 0 || echo $?) in
        0) state="running" ;;
        2) state="running, refuses DATABASE_URL's connection" ;;
        esac
        printf '%-10s %s  %s\n' "postgres:" "$url_host:$url_port" "$state"
    fi
    state="not running"
    port_open 127.0.0.1 "$KAFKA_PORT" && state="running"
    [[ -f $STATE_DIR/kafka.started ]] && state="$state (started by this script)"
    printf '%-10s %s  %s\n' "kafka:" "127.0.0.1:$KAFKA_PORT" "$state"
    parse_url "$REDIS_URL" 6379
    if port=$(private_redis_port); then
        printf '%-10s %s  %s\n' "redis:" "127.0.0.1:$port" "running (started by this script)"
    else
        state="not running"
        local reply
        if reply=$(redis_ping "$url_host" "$url_port"); then
            state="running"
            [[ $reply == +PONG ]] || state="running, answers PING with: ${reply:-nothing}"
        fi
        printf '%-10s %s  %s\n' "redis:" "$url_host:$url_port" "$state"
    fi
    local mode address
    for mode in "${PGB_MODES[@]}"; do
        address=-
        port=$(pgb_port "$mode") && address=127.0.0.1:$port
        state="pool_mode=$mode, not running"
        pgb_pid "$mode" >/dev/null && state="pool_mode=$mode, running (started by this script)"
        printf '%-10s %s  %s\n' "pgbouncer:" "$address" "$state"
    done
    address=-
    state="not running"
    if prometheus_pid >/dev/null; then
        address=127.0.0.1:$(cat "$PROM_DIR/port")
        state="running (private server in $PROM_DIR, started by this script)"
    fi
    printf '%-10s %s  %s\n' "prometheus:" "$address" "$state"
}

mkdir -p "$STATE_DIR"
STATE_DIR=$(cd "$STATE_DIR" && pwd)
PG_DIR=$STATE_DIR/postgres
PROM_DIR=$STATE_DIR/prometheus
command=up
case ${1:-} in
up | down | status)
    command=$1
    shift
    ;;
esac
case $command in
down)
    stop_started
    exit 0
    ;;
status)
    status
    exit 0
    ;;
esac

services=()
for argument in "$@"; do
    case $argument in
    --print-env) PRINT_ENV=1 ;;
    postgres | kafka | redis | pgbouncer | prometheus) services+=("$argument") ;;
    *) fail "unknown service '$argument'; expected postgres, kafka, redis, pgbouncer or prometheus (or --print-env)" ;;
    esac
done
((${#services[@]})) || services=(postgres kafka)
# PgBouncer stands in front of the PostgreSQL in use: postgres first, pgbouncer after it.
wanted=" ${services[*]} "
if [[ $wanted == *" pgbouncer "* ]]; then
    services=(postgres)
    for service in $wanted; do
        case $service in
        postgres | pgbouncer) ;;
        *) services+=("$service") ;;
        esac
    done
    services+=(pgbouncer)
fi
for service in "${services[@]}"; do
    case $service in
    postgres) start_postgres ;;
    kafka) start_kafka ;;
    redis) start_redis ;;
    pgbouncer) start_pgbouncer ;;
    prometheus) start_prometheus ;;
    esac
done
if ((PRINT_ENV)); then
    [[ -z $PG_URL ]] || printf 'export DATABASE_URL=%q\n' "$PG_URL"
    [[ -z $REDIS_OUT_URL ]] || printf 'export REDIS_URL=%q\n' "$REDIS_OUT_URL"
    [[ -z $PGB_SESSION_URL ]] || printf 'export IDEM_PGBOUNCER_SESSION_URL=%q\n' "$PGB_SESSION_URL"
    [[ -z $PGB_TRANSACTION_URL ]] || printf 'export IDEM_PGBOUNCER_TRANSACTION_URL=%q\n' "$PGB_TRANSACTION_URL"
    [[ -z $PROM_URL ]] || printf 'export PROMETHEUS_URL=%q\nexport PROMTOOL=%q\n' "$PROM_URL" "$PROMTOOL_BIN"
fi
