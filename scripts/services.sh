#!/usr/bin/env bash
# Starts the services that idem's tests, examples and demo use, when they are not running
# already: PostgreSQL, the `tansu` Kafka-API broker and, when asked, Redis. Running
# instances are reused; everything listens on loopback only; `down` stops only what this
# script started.
#
#   scripts/services.sh [up] [--print-env] [postgres] [kafka] [redis]
#                                  start what is missing (default: postgres kafka); with
#                                  --print-env, progress goes to stderr and stdout gets
#                                  `export DATABASE_URL=...` / `export REDIS_URL=...`
#                                  lines for `eval` (how test.sh and demo.sh use it)
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
# at REDIS_URL. Missing server programs are installed with apt-get or dnf when this runs
# as root or with password-less sudo; otherwise the script stops with the command to run.
#
# Environment:
#   IDEM_SERVICES_DIR  pid files, logs, the private cluster and the broker's storage
#                      (default: ${TMPDIR:-/tmp}/idem-services)
#   DATABASE_URL       where PostgreSQL is expected (default postgres://postgres@127.0.0.1:5432/postgres)
#   REDIS_URL          where Redis is expected (default redis://127.0.0.1:6379)
#   REDIS_PORT         Redis's port on 127.0.0.1 when REDIS_URL is not set (default 6379)
#   KAFKA_PORT         the broker's port on 127.0.0.1 (default 9092)
#   IDEM_NO_INSTALL=1  fail with the command to run instead of installing what is missing
#                      (tansu, PostgreSQL's or Redis's server programs)
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

owner_of() { # path
    stat -c %U "$1" 2>/dev/null || stat -f %Su "$1"
}

# Runs a PostgreSQL program as the private cluster's owner. PostgreSQL refuses to run as
# root: as root, the owner is the user `postgres` when there is one (the packages create
# it), `nobody` otherwise. From `/`, which every user may enter.
pg_run() {
    if [[ $(id -u) -ne 0 ]]; then
        (cd / && "$@")
        return
    fi
    local user
    user=$(owner_of "$PG_DIR")
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
            local user=postgres
            id -u postgres >/dev/null 2>&1 || user=nobody
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

start_kafka() {
    if port_open 127.0.0.1 "$KAFKA_PORT"; then
        say "kafka: a broker is running at 127.0.0.1:$KAFKA_PORT (reused)"
        return
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

wait_gone() { # pid seconds
    local deadline=$((SECONDS + $2))
    while kill -0 "$1" 2>/dev/null; do
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
    stop_postgres && stopped=1
    ((stopped)) || say "nothing to stop: this script started no service that still runs"
}

status() {
    local port state
    parse_url "$DATABASE_URL" 5432
    if port=$(private_pg_port); then
        printf '%-9s %s  %s\n' "postgres:" "127.0.0.1:$port" "running (private cluster in $PG_DIR, started by this script)"
    else
        state="not running"
        case $(pg_check "$url_host" "$url_port" "${url_user:-postgres}" "${url_path:-${url_user:-postgres}}" && echo 0 || echo $?) in
        0) state="running" ;;
        2) state="running, refuses DATABASE_URL's connection" ;;
        esac
        printf '%-9s %s  %s\n' "postgres:" "$url_host:$url_port" "$state"
    fi
    state="not running"
    port_open 127.0.0.1 "$KAFKA_PORT" && state="running"
    [[ -f $STATE_DIR/kafka.started ]] && state="$state (started by this script)"
    printf '%-9s %s  %s\n' "kafka:" "127.0.0.1:$KAFKA_PORT" "$state"
    parse_url "$REDIS_URL" 6379
    if port=$(private_redis_port); then
        printf '%-9s %s  %s\n' "redis:" "127.0.0.1:$port" "running (started by this script)"
    else
        state="not running"
        local reply
        if reply=$(redis_ping "$url_host" "$url_port"); then
            state="running"
            [[ $reply == +PONG ]] || state="running, answers PING with: ${reply:-nothing}"
        fi
        printf '%-9s %s  %s\n' "redis:" "$url_host:$url_port" "$state"
    fi
}

mkdir -p "$STATE_DIR"
STATE_DIR=$(cd "$STATE_DIR" && pwd)
PG_DIR=$STATE_DIR/postgres
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
    postgres | kafka | redis) services+=("$argument") ;;
    *) fail "unknown service '$argument'; expected postgres, kafka or redis (or --print-env)" ;;
    esac
done
((${#services[@]})) || services=(postgres kafka)
for service in "${services[@]}"; do
    case $service in
    postgres) start_postgres ;;
    kafka) start_kafka ;;
    redis) start_redis ;;
    esac
done
if ((PRINT_ENV)); then
    [[ -z $PG_URL ]] || printf 'export DATABASE_URL=%q\n' "$PG_URL"
    [[ -z $REDIS_OUT_URL ]] || printf 'export REDIS_URL=%q\n' "$REDIS_OUT_URL"
fi
