#!/usr/bin/env bash
# Starts the services that idem's tests, examples and demo use, when they are not running
# already: PostgreSQL, the `tansu` Kafka-API broker and, when asked, Redis. Running
# instances are reused; everything listens on loopback only; `down` stops only what this
# script started.
#
#   scripts/services.sh [up] [postgres] [kafka] [redis]   start what is missing
#                                                          (default: postgres kafka)
#   scripts/services.sh down                               stop what this script started
#   scripts/services.sh status                             show what runs
#
# Environment:
#   IDEM_SERVICES_DIR  pid files, logs and the broker's sqlite storage
#                      (default: ${TMPDIR:-/tmp}/idem-services)
#   DATABASE_URL       where PostgreSQL is expected (default postgres://postgres@127.0.0.1:5432/postgres)
#   KAFKA_PORT         the broker's port on 127.0.0.1 (default 9092)
#   REDIS_PORT         Redis's port on 127.0.0.1 (default 6379)
#   IDEM_NO_INSTALL=1  fail instead of installing tansu when it is missing
set -euo pipefail

TANSU_VERSION=0.6.0
TANSU_INSTALL="cargo install tansu --version ${TANSU_VERSION} --locked --features libsql"
STATE_DIR=${IDEM_SERVICES_DIR:-${TMPDIR:-/tmp}/idem-services}
KAFKA_PORT=${KAFKA_PORT:-9092}
REDIS_PORT=${REDIS_PORT:-6379}
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}

# host and port of DATABASE_URL: scheme://[user[:password]@]host[:port][/database][?...]
pg_authority=${DATABASE_URL#*://}
pg_authority=${pg_authority%%[/?]*}
pg_authority=${pg_authority##*@}
PG_HOST=${pg_authority%%:*}
PG_PORT=5432
[[ $pg_authority == *:* ]] && PG_PORT=${pg_authority##*:}

say() { printf '%s\n' "$*"; }
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

as_root_or_sudo() {
    if [[ $(id -u) -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        "$@"
    fi
}

postgres_up() {
    if command -v pg_isready >/dev/null 2>&1; then
        pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 3
    else
        port_open "$PG_HOST" "$PG_PORT"
    fi
}

start_postgres() {
    if postgres_up; then
        say "postgres: running at $PG_HOST:$PG_PORT (reused)"
        return
    fi
    case $PG_HOST in
    127.0.0.1 | localhost | ::1) ;;
    *) fail "PostgreSQL does not answer at $PG_HOST:$PG_PORT (from DATABASE_URL); start it there, or unset DATABASE_URL to use a local one" ;;
    esac
    local version=""
    if command -v pg_ctlcluster >/dev/null 2>&1 && [[ -d /etc/postgresql ]]; then
        version=$(ls /etc/postgresql | sort -V | tail -n 1)
    fi
    [[ -n $version ]] || fail "PostgreSQL is not running at $PG_HOST:$PG_PORT and no local cluster was found to start.
  Install it (Debian: sudo apt-get install -y postgresql) with 'trust' authentication for
  local TCP connections of the user in DATABASE_URL, or set DATABASE_URL to a running server."
    say "postgres: starting cluster $version/main"
    as_root_or_sudo pg_ctlcluster --skip-systemctl-redirect "$version" main start ||
        fail "pg_ctlcluster could not start PostgreSQL $version/main (run this script as root or as a user with sudo)"
    local deadline=$((SECONDS + 30))
    until postgres_up; do
        ((SECONDS < deadline)) || fail "PostgreSQL $version/main started but does not answer at $PG_HOST:$PG_PORT"
        sleep 0.5
    done
    printf '%s\n' "$version" >"$STATE_DIR/postgres.started"
    say "postgres: running at $PG_HOST:$PG_PORT (started)"
}

start_redis() {
    if port_open 127.0.0.1 "$REDIS_PORT"; then
        say "redis: running at 127.0.0.1:$REDIS_PORT (reused)"
        return
    fi
    command -v redis-server >/dev/null 2>&1 ||
        fail "Redis is not running at 127.0.0.1:$REDIS_PORT and redis-server is not installed (Debian: sudo apt-get install -y redis-server)"
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
        --pidfile "$STATE_DIR/redis.pid" --logfile "$STATE_DIR/redis.log" >/dev/null
    wait_port 127.0.0.1 "$REDIS_PORT" 10 || fail "redis-server did not start; see $STATE_DIR/redis.log"
    touch "$STATE_DIR/redis.started"
    say "redis: running at 127.0.0.1:$REDIS_PORT (started)"
}

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
            </dev/null >>"$STATE_DIR/tansu.log" 2>&1
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
            say "redis: stopped (pid $pid)"
        fi
        rm -f "$STATE_DIR/redis.started"
        stopped=1
    fi
    if [[ -f $STATE_DIR/postgres.started ]]; then
        local version
        version=$(cat "$STATE_DIR/postgres.started")
        as_root_or_sudo pg_ctlcluster --skip-systemctl-redirect "$version" main stop && say "postgres: stopped cluster $version/main"
        rm -f "$STATE_DIR/postgres.started"
        stopped=1
    fi
    ((stopped)) || say "nothing to stop: this script started no service that still runs"
}

status() {
    local name host port
    for entry in "postgres $PG_HOST $PG_PORT" "kafka 127.0.0.1 $KAFKA_PORT" "redis 127.0.0.1 $REDIS_PORT"; do
        read -r name host port <<<"$entry"
        local state="not running"
        if [[ $name == postgres ]]; then
            postgres_up && state="running"
        else
            port_open "$host" "$port" && state="running"
        fi
        [[ -f $STATE_DIR/$name.started ]] && state="$state (started by this script)"
        printf '%-9s %s:%s  %s\n' "$name:" "$host" "$port" "$state"
    done
}

mkdir -p "$STATE_DIR"
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

services=("$@")
((${#services[@]})) || services=(postgres kafka)
for service in "${services[@]}"; do
    case $service in
    postgres) start_postgres ;;
    kafka) start_kafka ;;
    redis) start_redis ;;
    *) fail "unknown service '$service'; expected postgres, kafka or redis" ;;
    esac
done
