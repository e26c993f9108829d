#!/usr/bin/env bash
# What a new message costs as the status table grows: idem's new-message SQL (idem.sql)
# and the bare business transaction (bare.sql), with the write-ahead log each writes per
# message, at each size of the status table. Each size has a database of its own, filled
# with SQL (SHA-like random keys, as digests are, created evenly over the last eight days),
# vacuumed and analyzed; then every round measures all the sizes and the bare transaction
# side by side, in the same minutes, the order turning from round to round, each cell
# right after a CHECKPOINT (the worst case: every page a new message touches is written
# whole to the WAL first). A cell as long as `checkpoint_timeout` (SCALE_SECS=300 on a
# default server) measures over a whole checkpoint cycle instead.
#
# At the largest size, retention while messages flow: new messages alone, then while
# `idem purge --older-than 7d` deletes the oldest day's keys (an eighth of the table); then
# the next day's keys purged alone, with the purge's time and WAL.
#
# SCALE_LAYOUT=timed measures keys kept by the fact's time (`event_time`) instead: the table
# `idem_timed_keys`, its hourly buckets made for the last eight days, the keys' facts spread
# evenly over the last seven, and idem_timed.sql for a new message (a fact a few seconds
# old). Its retention is the expiry of the oldest bucket (`idem_timed_expire`, what the
# cleanup runs) while new messages flow, then of the next one alone.
#
#   bash benches/ceilings/scale.sh                  # sizes 0, 5M, 20M and 100M keys, about 2 hours
#   SCALE_LAYOUT=timed bash benches/ceilings/scale.sh
#   SCALE_SIZES="0 5000000" SCALE_SECS=20 SCALE_ROUNDS=2 bash benches/ceilings/scale.sh
#   SCALE_KEEP=1 bash benches/ceilings/scale.sh     # keep the filled databases; a later run
#                                                   # with the same sizes and layout reuses them
#   SCALE_RETENTION=0 ...                           # no retention measure (it removes keys
#                                                   # from the largest database)
#   SCALE_SECS=300 SCALE_RETENTION_SECS=30 ...      # cells over a whole checkpoint cycle
#   SCALE_FULL_HOUR=1 SCALE_LAYOUT=timed ...        # the current bucket full, as at the end
#                                                   # of an hour (see below)
#   SCALE_TSV=scale.tsv bash benches/ceilings/scale.sh && python3 benches/ceilings/chart.py scale.tsv > chart.svg
#
# Uses databases of its own, SCALE_DATABASE (default idem_scale) followed by the layout and
# the size (idem_scale_keys_20000000), each migrated with the `idem` command line (`cargo
# run -p idem-cli`) and dropped at the end unless SCALE_KEEP=1. A database that a kept run
# filled to its size is reused as it is (after the retention measure of the status table,
# the largest one is filled again). Connects with the libpq environment (PGHOST, PGPORT,
# PGUSER; default 127.0.0.1:5432 as postgres). 100 million keys take about 18 GB of disk.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
prefix=${SCALE_DATABASE:-idem_scale}
sizes=${SCALE_SIZES:-"0 5000000 20000000 100000000"}
secs=${SCALE_SECS:-30}
rounds=${SCALE_ROUNDS:-2}
clients=${SCALE_CLIENTS:-16}
layout=${SCALE_LAYOUT:-keys}
case "$layout" in
    keys) table=idem.idem_keys; script=idem ;;
    timed) table=idem.idem_timed_keys; script=idem_timed ;;
    *) echo "scale: SCALE_LAYOUT is keys or timed, not '$layout'" >&2; exit 1 ;;
esac
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}

for tool in pgbench psql createdb dropdb cargo; do
    command -v "$tool" >/dev/null || { echo "scale: '$tool' is missing" >&2; exit 1; }
done

sizes=$(tr ' ' '\n' <<<"$sizes" | grep . | sort -n | uniq | tr '\n' ' ')
largest=$(tr ' ' '\n' <<<"$sizes" | grep . | tail -n 1)
smallest=$(tr ' ' '\n' <<<"$sizes" | grep . | head -n 1)
database_of() { echo "${prefix}_${layout}_$1"; }
cleanup() {
    [[ ${SCALE_KEEP:-0} == 1 ]] && return
    for size in $sizes; do dropdb --if-exists "$(database_of "$size")"; done
}
trap cleanup EXIT
cargo build -q --release --manifest-path "$root/Cargo.toml" -p idem-cli
idem_cli="$root/target/release/idem"

# A database filled with $1 keys (the new messages of the cells come on top), made unless a
# kept run left it at that size: migrated, the business table made, then the keys inserted
# with SQL in steps of a million (one transaction each). The keys were created evenly over
# the eight days before the fill (the timed layout: their facts over the last seven), the
# oldest first.
prepare() {
    local size=$1 database filled=0 step
    database=$(database_of "$size")
    if [[ $(psql -d "$database" -qAtc "SELECT size FROM scale_filled" 2>/dev/null) == "$size" ]]; then
        echo "scale: reusing $database" >&2
        return
    fi
    dropdb --if-exists "$database"
    createdb "$database"
    "$idem_cli" -D "postgres://$PGUSER@$PGHOST:$PGPORT/$database" migrate >/dev/null
    psql -d "$database" -qc "CREATE TABLE order_effects (id bigserial PRIMARY KEY, order_id text NOT NULL,
                             event_type text NOT NULL, amount_cents bigint NOT NULL)"
    if [[ $layout == timed ]]; then
        psql -d "$database" -qAtc "SELECT count(*) FROM generate_series(now() - interval '8 days', now() + interval '2 hours',
                                       interval '1 hour') AS at, idem.idem_timed_bucket(at, interval '1 hour', 777600000, 10800000)" >/dev/null
    fi
    while (( filled < size )); do
        step=$(( size - filled < 1000000 ? size - filled : 1000000 ))
        if [[ $layout == timed ]]; then
            psql -d "$database" -qc "INSERT INTO idem.idem_timed_keys (scope, key, fact_time, status, attempts, fingerprint, created_at, updated_at)
                SELECT 'ceiling', md5('fill' || g::text)::uuid, t, 'success', 1,
                       '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea, t, t
                FROM generate_series($filled + 1, $filled + $step) AS g,
                     LATERAL (SELECT now() - ($size - g) * interval '7 days' / $size AS t) AS at"
        else
            psql -d "$database" -qc "INSERT INTO idem.idem_keys (scope, key, status, attempts, fingerprint, created_at, updated_at)
                SELECT 'ceiling', md5('fill' || g::text)::uuid, 'success', 1,
                       '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea,
                       now() - ($size - g) * interval '8 days' / $size, now() - ($size - g) * interval '8 days' / $size
                FROM generate_series($filled + 1, $filled + $step) AS g"
        fi
        filled=$(( filled + step ))
    done
    psql -d "$database" -qc "VACUUM ANALYZE $table" -c "VACUUM ANALYZE order_effects" \
        -c "CREATE TABLE scale_filled AS SELECT $size::bigint AS size"
}

# The size of the status table of database $1 (its buckets, for the timed layout), indexes
# included.
table_size() {
    psql -d "$1" -qAtc "SELECT pg_size_pretty(coalesce(sum(pg_total_relation_size(c)), 0))
        FROM (SELECT '$table'::regclass AS c
              UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = '$table'::regclass) AS t"
}

# One cell: "<tps>|<WAL bytes per transaction>" of script $2 on database $1, right after a
# checkpoint.
cell() {
    local before after report tps count
    psql -d "$1" -qc "CHECKPOINT"
    before=$(psql -d "$1" -qAtc "SELECT pg_current_wal_lsn()")
    report=$(pgbench -n -M simple -D prepared=0 -c "$clients" -j 2 -T "$secs" -f "$here/$2.sql" "$1" 2>&1)
    after=$(psql -d "$1" -qAtc "SELECT pg_current_wal_lsn()")
    tps=$(awk '/^tps/ { print $3 }' <<<"$report")
    count=$(awk '/number of transactions actually processed/ { split($0, a, ": "); split(a[2], b, "/"); print b[1] }' <<<"$report")
    psql -d "$1" -qAtc "SELECT '$tps', round(pg_wal_lsn_diff('$after', '$before') / greatest($count, 1))"
}

for size in $sizes; do prepare "$size"; done

# SCALE_FULL_HOUR=1 (timed layout): the bucket that new messages go to holds a whole
# bucket's share of the keys (size / 168, an hour of a week's keys) before the rounds, as
# it does at the end of each hour, when its index is largest: the worst case of the WAL
# that a checkpoint costs. Without it, the current bucket holds what the fill and the
# earlier cells put there (little, early in an hour). A kept database stays reusable:
# the next run tops its current bucket up again.
if [[ ${SCALE_FULL_HOUR:-0} == 1 && $layout == timed ]]; then
    for size in $sizes; do
        (( size > 0 )) || continue
        psql -d "$(database_of "$size")" -qc "INSERT INTO idem.idem_timed_keys (scope, key, fact_time, status, attempts, fingerprint, created_at, updated_at)
            SELECT 'ceiling', gen_random_uuid(), t, 'success', 1,
                   '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea, t, t
            FROM generate_series(1, greatest($size / 168 - (SELECT count(*) FROM idem.idem_timed_keys
                                                             WHERE fact_time >= date_trunc('hour', now())), 0)) AS g,
                 LATERAL (SELECT date_trunc('hour', now()) + random() * (now() - date_trunc('hour', now())) AS t) AS at" \
            -c "VACUUM ANALYZE idem.idem_timed_keys"
    done
fi

tsv=${SCALE_TSV:-/dev/null}
printf 'keys\tround\tidem_tps\tbare_tps\tidem_wal\tbare_wal\n' >"$tsv"
echo "pgbench, c=$clients, $secs s a cell after a CHECKPOINT, $rounds rounds, the sizes side by side (the order turning), layout $layout ($table)"
echo "the bare transaction runs once a round, on the smallest size's database; x smallest: against the smallest size in the same round"
printf '%6s %12s %12s %10s %10s %12s %12s %12s %12s\n' round keys "table+index" "idem tps" "bare tps" "x smallest" "idem WAL/msg" "bare WAL/msg" "x smallest"
for (( round = 1; round <= rounds; round++ )); do
    # The cells of the round: each size and the bare transaction, turned by the round.
    cells=(bare $sizes)
    shift_by=$(( (round - 1) % ${#cells[@]} ))
    cells=("${cells[@]:shift_by}" "${cells[@]:0:shift_by}")
    declare -A got=()
    for what in "${cells[@]}"; do
        if [[ $what == bare ]]; then
            got[bare]=$(cell "$(database_of "$smallest")" bare)
        else
            # The empty table stays empty: the earlier cells' messages go.
            (( what > 0 )) || psql -d "$(database_of 0)" -qc "TRUNCATE $table, order_effects"
            got[$what]=$(cell "$(database_of "$what")" "$script")
        fi
    done
    read -r bare_tps bare_wal <<<"${got[bare]//|/ }"
    read -r base_tps base_wal <<<"${got[$smallest]//|/ }"
    for size in $sizes; do
        read -r idem_tps idem_wal <<<"${got[$size]//|/ }"
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$size" "$round" "$idem_tps" "$bare_tps" "$idem_wal" "$bare_wal" >>"$tsv"
        printf '%6s %12s %12s %10.0f %10.0f %12.2f %12s %12s %12.2f\n' "$round" "$size" "$(table_size "$(database_of "$size")")" \
            "$idem_tps" "$bare_tps" "$(awk -v a="$idem_tps" -v b="$base_tps" 'BEGIN { print a / b }')" \
            "$idem_wal" "$bare_wal" "$(awk -v a="$idem_wal" -v b="$base_wal" 'BEGIN { print a / (b > 0 ? b : 1) }')"
    done
    unset got
done

[[ ${SCALE_RETENTION:-1} == 1 ]] || exit 0
secs=${SCALE_RETENTION_SECS:-$secs}
database=$(database_of "$largest")
url="postgres://$PGUSER@$PGHOST:$PGPORT/$database"
# What follows removes keys. The status table loses a quarter of them (two days of eight):
# the database is no longer the size it was filled to, and a later run fills it again. The
# timed layout loses two buckets (1.2 % of a week): the database stays reusable.
if (( largest > 0 )) && [[ $layout == keys ]]; then
    psql -d "$database" -qc "DROP TABLE scale_filled"
fi

# Retention at the largest size: `idem purge` of the oldest day's keys while new messages
# flow, then of the next day's alone. Prints "<seconds> <WAL bytes> <deleted>" for a purge.
purge() {
    local before after started report
    before=$(psql -d "$database" -qAtc "SELECT pg_current_wal_lsn()")
    started=$(date +%s.%N)
    report=$("$idem_cli" -D "$url" --json purge --older-than "$1")
    after=$(psql -d "$database" -qAtc "SELECT pg_current_wal_lsn()")
    printf '%s %s %s\n' "$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" \
        "$(psql -d "$database" -qAtc "SELECT pg_wal_lsn_diff('$after', '$before')")" \
        "$(sed -n 's/.*"deleted": *\([0-9]*\).*/\1/p' <<<"$report" | head -n 1)"
}

# Expiry of the timed layout's oldest bucket: "<seconds> <WAL bytes> <bucket>" for one call
# of what the cleanup runs, with a window that leaves the bucket just behind it.
expire() {
    local before after started bucket
    before=$(psql -d "$database" -qAtc "SELECT pg_current_wal_lsn()")
    started=$(date +%s.%N)
    bucket=$(psql -d "$database" -qAtc "SELECT idem.idem_timed_expire(
        floor(extract(epoch FROM now() - (SELECT min(ends_at) FROM idem.idem_timed_buckets)) * 1000)::bigint, 1000)")
    after=$(psql -d "$database" -qAtc "SELECT pg_current_wal_lsn()")
    printf '%s %s %s\n' "$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')" \
        "$(psql -d "$database" -qAtc "SELECT pg_wal_lsn_diff('$after', '$before')")" "${bucket:-none}"
}

if (( largest > 0 )) && [[ $layout == timed ]]; then
    read -r alone _ <<<"$(cell "$database" "$script" | tr '|' ' ')"
    psql -d "$database" -qc "CHECKPOINT"
    during_log=$(mktemp)
    pgbench -n -M simple -D prepared=0 -c "$clients" -j 2 -T "$secs" -f "$here/$script.sql" "$database" >"$during_log" 2>&1 &
    ingest=$!
    sleep 2
    read -r during_secs during_wal during_bucket <<<"$(expire)"
    wait "$ingest"
    during=$(awk '/^tps/ { print $3 }' "$during_log")
    rm -f "$during_log"
    psql -d "$database" -qc "CHECKPOINT"
    read -r alone_secs alone_wal alone_bucket <<<"$(expire)"
    echo
    echo "retention at $largest keys: the oldest bucket ($(( largest / 168 )) keys) expired while new messages flow"
    printf '  new messages alone %.0f tps, while the bucket expires %.0f tps (%.2fx)\n' "$alone" "$during" \
        "$(awk -v a="$during" -v b="$alone" 'BEGIN { print a / b }')"
    printf '  expiry of %s during them: %s s, %.1f MB of WAL (theirs included)\n' "$during_bucket" "$during_secs" \
        "$(awk -v w="$during_wal" 'BEGIN { print w / 1048576 }')"
    printf '  expiry of %s alone: %s s, %.2f MB of WAL; the table afterwards: %s\n' "$alone_bucket" "$alone_secs" \
        "$(awk -v w="$alone_wal" 'BEGIN { print w / 1048576 }')" "$(table_size "$database")"
elif (( largest > 0 )); then
    read -r alone _ <<<"$(cell "$database" "$script" | tr '|' ' ')"
    psql -d "$database" -qc "CHECKPOINT"
    during_log=$(mktemp)
    pgbench -n -M simple -D prepared=0 -c "$clients" -j 2 -T "$secs" -f "$here/$script.sql" "$database" >"$during_log" 2>&1 &
    ingest=$!
    sleep 2
    read -r during_secs during_wal during_deleted <<<"$(purge 7d)"
    wait "$ingest"
    during=$(awk '/^tps/ { print $3 }' "$during_log")
    rm -f "$during_log"
    psql -d "$database" -qc "CHECKPOINT"
    read -r alone_secs alone_wal alone_deleted <<<"$(purge 6d)"
    echo
    echo "retention at $largest keys: idem purge of a day's keys while new messages flow"
    printf '  new messages alone %.0f tps, during the purge %.0f tps (%.2fx)\n' "$alone" "$during" \
        "$(awk -v a="$during" -v b="$alone" 'BEGIN { print a / b }')"
    printf '  purge of %s keys during them: %s s, %.0f MB of WAL (theirs included)\n' "$during_deleted" "$during_secs" \
        "$(awk -v w="$during_wal" 'BEGIN { print w / 1048576 }')"
    printf '  purge of %s keys alone: %s s, %.0f MB of WAL; the table afterwards: %s\n' "$alone_deleted" "$alone_secs" \
        "$(awk -v w="$alone_wal" 'BEGIN { print w / 1048576 }')" \
        "$(psql -d "$database" -qAtc "SELECT pg_size_pretty(pg_total_relation_size('idem.idem_keys'))")"
fi
