#!/usr/bin/env bash
# What a new message costs in status-table layouts that split the keys into time units,
# against one table, as the keys of the retention window grow: the per-message price of
# dropping expired keys by unit instead of deleting them.
#
# Each layout keeps a window of N keys (compact rows: key uuid, scope_id int4, status
# "char", attempts int2, created_at; the columns a row rarely sets are NULL):
#   single:  one table, unique (key, scope_id): the cheapest SQL with the guarantee;
#   units-K: K sealed units holding N/K keys each and the current unit, half full (the
#            average over its life), each a partition with its own unique (key, scope_id)
#            index. A new message takes the rotation's shared lock in BEGIN's round trip,
#            then, in one statement, looks for its key in every unit and inserts it into
#            the current one: a unit's index can only tell its own keys, so a new key has
#            to be looked up in each of the K + 1.
# Each cell is pgbench (c=16, synchronous commit on) for LAYOUTS_SECS seconds right after
# a CHECKPOINT, the layout's new message beside the bare business transaction (bare.sql),
# the order alternating between rounds, with the WAL written per transaction.
#
# The expiry of a unit's keys while messages flow: ingest alone, then ingest while the
# oldest unit's keys go (units-K: DETACH ... CONCURRENTLY and DROP; single: the same keys
# deleted in batches of 10,000 as `idem purge` does), with the expiry's time and WAL.
#
#   bash benches/ceilings/layouts.sh                                   # most of a day
#   LAYOUTS="single units-7" LAYOUTS_SIZES="0 5000000" LAYOUTS_SECS=10 bash benches/ceilings/layouts.sh
#
# Uses its own database (LAYOUTS_DATABASE, default idem_layouts; made again at the start,
# dropped at the end unless LAYOUTS_KEEP=1). Connects with the libpq environment (PGHOST,
# PGPORT, PGUSER; default 127.0.0.1:5432 as postgres). 100 million keys take about 10 GB.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
database=${LAYOUTS_DATABASE:-idem_layouts}
layouts=${LAYOUTS:-"single units-1 units-7 units-24 units-168"}
sizes=${LAYOUTS_SIZES:-"0 20000000 100000000"}
secs=${LAYOUTS_SECS:-20}
rounds=${LAYOUTS_ROUNDS:-2}
clients=${LAYOUTS_CLIENTS:-16}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"

for tool in pgbench psql createdb dropdb; do
    command -v "$tool" >/dev/null || { echo "layouts: '$tool' is missing" >&2; exit 1; }
done

dropdb --if-exists "$database"
createdb "$database"
cleanup() { [[ ${LAYOUTS_KEEP:-0} == 1 ]] || dropdb --if-exists "$database"; }
trap cleanup EXIT
work=$(mktemp -d)
trap 'rm -rf "$work"; cleanup' EXIT

sql() { psql -d "$database" -qAtX -v ON_ERROR_STOP=1 "$@"; }

sql -c "CREATE TABLE order_effects (id bigserial PRIMARY KEY, order_id text NOT NULL,
        event_type text NOT NULL, amount_cents bigint NOT NULL)"

# The compact row, as a column list for CREATE TABLE.
row="key uuid NOT NULL, scope_id int4 NOT NULL, status \"char\" NOT NULL, attempts int2 NOT NULL,
     created_at timestamptz NOT NULL DEFAULT now(), fingerprint bytea, result json, last_error text"

# `n` keys md5(<prefix> || i) for i in 1..n, into table $1, in one-million steps; random
# order, as digests are. Key i was created n - i seconds ago.
fill() {
    local table=$1 prefix=$2 n=$3 from=1
    while (( from <= n )); do
        local to=$(( from + 999999 < n ? from + 999999 : n ))
        sql -c "INSERT INTO $table (key, scope_id, status, attempts, created_at)
                SELECT md5('$prefix' || g::text)::uuid, 1, 's', 1, now() - ($n - g) * interval '1 second'
                FROM generate_series($from, $to) AS g"
        from=$(( to + 1 ))
    done
}

# Creates layout $1 with a window of $2 keys; writes the new message's script to
# $work/$1.sql.
build() {
    local layout=$1 n=$2
    sql -c "DROP TABLE IF EXISTS k_single, k_units CASCADE" -c "TRUNCATE order_effects"
    case $layout in
        single)
            sql -c "CREATE TABLE k_single ($row)"
            sql -c "ALTER TABLE k_single ADD PRIMARY KEY (key, scope_id)" \
                -c "CREATE INDEX ON k_single USING brin (created_at) WITH (autosummarize = on)"
            fill k_single fill "$n"
            (( n == 0 )) || sql -c "VACUUM ANALYZE k_single"
            cat >"$work/$layout.sql" <<'SQL'
\set n random(1, 9000000000000000000)
\if :prepared = 0
PREPARE claim (int4, uuid, text) AS
INSERT INTO k_single AS k (key, scope_id, status, attempts) VALUES ($2, $1, 's', 1)
ON CONFLICT (key, scope_id) DO NOTHING
RETURNING pg_current_xact_id()::text::bigint AS xid, set_config('lock_timeout', $3, true) AS restored;
PREPARE effect (text, text, bigint) AS
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3);
\set prepared 1
\endif
BEGIN \; SET LOCAL lock_timeout = '5000ms';
EXECUTE claim(1, md5(:n::text)::uuid, '0');
EXECUTE effect('o-' || :n, 'paid', 100);
SAVEPOINT idem_commit_check \; COMMIT;
SQL
            ;;
        units-*)
            local k=${layout#units-} unit
            sql -c "CREATE TABLE k_units (unit int4 NOT NULL, $row) PARTITION BY LIST (unit)"
            for (( unit = 0; unit <= k; unit++ )); do
                sql -c "CREATE TABLE k_units_$unit PARTITION OF k_units FOR VALUES IN ($unit)" \
                    -c "ALTER TABLE k_units_$unit ALTER COLUMN unit SET DEFAULT $unit"
                if (( unit < k )); then
                    # A sealed unit: loaded, then indexed.
                    fill "k_units_$unit" "u$unit-" $(( n / k ))
                    sql -c "CREATE UNIQUE INDEX ON k_units_$unit (key, scope_id)"
                else
                    # The current unit: half a unit's keys, inserted into its index, as
                    # claims fill it.
                    sql -c "CREATE UNIQUE INDEX ON k_units_$unit (key, scope_id)"
                    fill "k_units_$unit" "u$unit-" $(( n / k / 2 ))
                fi
            done
            (( n == 0 )) || sql -c "VACUUM ANALYZE k_units"
            cat >"$work/$layout.sql" <<SQL
\\set n random(1, 9000000000000000000)
\\if :prepared = 0
PREPARE claim (int4, uuid, text) AS
INSERT INTO k_units_$k AS k (unit, key, scope_id, status, attempts)
SELECT $k, \$2, \$1, 's', 1
WHERE NOT EXISTS (SELECT FROM k_units AS u WHERE u.key = \$2 AND u.scope_id = \$1)
ON CONFLICT (key, scope_id) DO NOTHING
RETURNING pg_current_xact_id()::text::bigint AS xid, set_config('lock_timeout', \$3, true) AS restored;
PREPARE effect (text, text, bigint) AS
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES (\$1, \$2, \$3);
\\set prepared 1
\\endif
BEGIN \\; SET LOCAL lock_timeout = '5000ms' \\; SELECT pg_advisory_xact_lock_shared(7, 1);
EXECUTE claim(1, md5(:n::text)::uuid, '0');
EXECUTE effect('o-' || :n, 'paid', 100);
SAVEPOINT idem_commit_check \\; COMMIT;
SQL
            ;;
        *) echo "layouts: unknown layout $layout" >&2; exit 1 ;;
    esac
}

# The size of layout $1's tables and indexes, in bytes.
bytes() {
    case $1 in
        single) sql -c "SELECT pg_total_relation_size('k_single')" ;;
        *) sql -c "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                    WHERE i.inhparent = 'k_units'::regclass" ;;
    esac
}

# One cell: "<tps> <WAL bytes per transaction>" of script $1 ($work/<name>.sql or a
# ceiling of this directory), right after a checkpoint.
cell() {
    local script=$1 before after report tps count
    sql -c "CHECKPOINT"
    before=$(sql -c "SELECT pg_current_wal_lsn()")
    report=$(pgbench -n -M simple -D prepared=0 -c "$clients" -j 2 -T "$secs" -f "$script" "$database" 2>&1)
    after=$(sql -c "SELECT pg_current_wal_lsn()")
    tps=$(awk '/^tps/ { print $3 }' <<<"$report")
    count=$(awk '/number of transactions actually processed/ { split($0, a, ": "); split(a[2], b, "/"); print b[1] }' <<<"$report")
    [[ -n $tps && -n $count ]] || { echo "layouts: pgbench failed: $report" >&2; exit 1; }
    sql -c "SELECT '$tps', round(pg_wal_lsn_diff('$after', '$before') / greatest($count, 1))" | tr '|' ' '
}

# Expires the keys of unit $2 (the $3 oldest keys of `single`, created before the others)
# of layout $1: DETACH ... CONCURRENTLY and DROP, or DELETE in batches of 10,000 as
# `idem purge` does. Prints "<seconds> <WAL bytes>".
expire() {
    local layout=$1 unit=$2 count=$3 before after started
    before=$(sql -c "SELECT pg_current_wal_lsn()")
    started=$(date +%s.%N)
    case $layout in
        single)
            local cutoff deleted
            cutoff=$(sql -c "SELECT min(created_at) + ($count * ($unit + 1)) * interval '1 second' FROM k_single")
            while :; do
                deleted=$(sql -c "WITH gone AS (DELETE FROM k_single WHERE ctid = ANY(ARRAY(
                                      SELECT ctid FROM k_single WHERE created_at < '$cutoff'
                                      LIMIT 10000 FOR UPDATE SKIP LOCKED)) RETURNING 1)
                                  SELECT count(*) FROM gone")
                (( deleted > 0 )) || break
            done
            ;;
        *)
            sql -c "ALTER TABLE k_units DETACH PARTITION k_units_$unit CONCURRENTLY"
            sql -c "DROP TABLE k_units_$unit"
            ;;
    esac
    after=$(sql -c "SELECT pg_current_wal_lsn()")
    printf '%s %s\n' "$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')" \
        "$(sql -c "SELECT pg_wal_lsn_diff('$after', '$before')")"
}

# Ingest alone, then ingest while unit 0 expires; then unit 1 expires alone.
expiry() {
    local layout=$1 n=$2 k per alone during_tps expiry_during expiry_alone report
    k=$([[ $layout == single ]] && echo 7 || echo "${layout#units-}")
    per=$(( n / k ))
    read -r alone _ <<<"$(cell "$work/$layout.sql")"
    sql -c "CHECKPOINT"
    pgbench -n -M simple -D prepared=0 -c "$clients" -j 2 -T "$secs" -f "$work/$layout.sql" "$database" >"$work/during" 2>&1 &
    local ingest=$!
    sleep 2
    expiry_during=$(expire "$layout" 0 "$per")
    wait "$ingest"
    during_tps=$(awk '/^tps/ { print $3 }' "$work/during")
    sql -c "CHECKPOINT"
    expiry_alone=$(expire "$layout" 1 "$per")
    printf '%-10s %11s %9.0f %9.0f %7.2f   expiry of %s keys: %s s (%s s during ingest), %s MB of WAL\n' \
        "$layout" "$n" "$alone" "$during_tps" "$(awk -v a="$during_tps" -v b="$alone" 'BEGIN { print a / b }')" "$per" \
        "${expiry_alone%% *}" "${expiry_during%% *}" "$(awk -v w="${expiry_alone##* }" 'BEGIN { printf "%.1f", w / 1048576 }')"
}

echo "pgbench, c=$clients, $secs s a cell after a CHECKPOINT, $rounds rounds (the order alternating), database $database"
printf '%-10s %11s %9s %9s %9s %7s %9s %9s\n' layout keys MB "B/key" "idem tps" ratio "WAL/msg" "bare WAL"
for size in $sizes; do
    for layout in $layouts; do
        build "$layout" "$size"
        total=$(bytes "$layout")
        for (( round = 1; round <= rounds; round++ )); do
            if (( round % 2 == 1 )); then order=(idem bare); else order=(bare idem); fi
            for shape in "${order[@]}"; do
                if [[ $shape == idem ]]; then
                    read -r idem_tps idem_wal <<<"$(cell "$work/$layout.sql")"
                else
                    read -r bare_tps bare_wal <<<"$(cell "$here/bare.sql")"
                fi
            done
            printf '%-10s %11s %9.0f %9s %9.0f %7.2f %9s %9s\n' "$layout" "$size" \
                "$(awk -v b="$total" 'BEGIN { print b / 1048576 }')" \
                "$(awk -v b="$total" -v n="$size" 'BEGIN { print (n > 0 ? int(b / n) : "-") }')" \
                "$idem_tps" "$(awk -v a="$idem_tps" -v b="$bare_tps" 'BEGIN { print a / b }')" \
                "$idem_wal" "$bare_wal"
        done
    done
done

# The expiry of a unit's keys while messages flow, at the largest size.
largest=$(tr ' ' '\n' <<<"$sizes" | sort -n | tail -n 1)
if (( largest > 0 )); then
    echo
    echo "expiry of the oldest unit's keys at $largest keys (single: the same share, 1/7, deleted in batches)"
    printf '%-10s %11s %9s %9s %7s\n' layout keys alone during ratio
    for layout in ${LAYOUTS_EXPIRY:-single units-7}; do
        build "$layout" "$largest"
        expiry "$layout" "$largest"
    done
fi
