#!/usr/bin/env bash
# What a new message costs as the status table grows: idem's new-message SQL (idem.sql)
# and the bare business transaction (bare.sql) side by side, at each size of the status
# table, with the write-ahead log each writes per message. The table is filled with SQL
# (SHA-like random keys, as digests are, created evenly over the last eight days), then
# vacuumed and checkpointed, so that every cell starts right after a checkpoint, as a
# long-running consumer's minutes do.
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
#   SCALE_TSV=scale.tsv bash benches/ceilings/scale.sh && python3 benches/ceilings/chart.py scale.tsv > chart.svg
#
# Uses its own database (SCALE_DATABASE, default idem_scale; dropped and made again at the
# start, dropped at the end unless SCALE_KEEP=1), migrated with the `idem` command line
# (`cargo run -p idem-cli`). Connects with the libpq environment (PGHOST, PGPORT, PGUSER;
# default 127.0.0.1:5432 as postgres). 100 million keys take about 18 GB of disk.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
database=${SCALE_DATABASE:-idem_scale}
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

dropdb --if-exists "$database"
createdb "$database"
cleanup() { [[ ${SCALE_KEEP:-0} == 1 ]] || dropdb --if-exists "$database"; }
trap cleanup EXIT
url="postgres://$PGUSER@$PGHOST:$PGPORT/$database"
cargo build -q --release --manifest-path "$root/Cargo.toml" -p idem-cli
idem_cli="$root/target/release/idem"
"$idem_cli" -D "$url" migrate >/dev/null
psql -d "$database" -qc "CREATE TABLE order_effects (id bigserial PRIMARY KEY, order_id text NOT NULL,
                         event_type text NOT NULL, amount_cents bigint NOT NULL)"

# Grows the status table to $1 keys filled with SQL (the new messages of the cells come on
# top), in steps of a million (one transaction each). The keys filled for a size were
# created evenly over the eight days before the fill, the oldest first.
filled=0
if [[ $layout == timed ]]; then
    psql -d "$database" -qAtc "SELECT count(*) FROM generate_series(now() - interval '8 days', now() + interval '2 hours',
                                   interval '1 hour') AS at, idem.idem_timed_bucket(at, interval '1 hour', 777600000, 10800000)" >/dev/null
fi
fill_to() {
    while (( filled < $1 )); do
        local step=$(( $1 - filled < 1000000 ? $1 - filled : 1000000 ))
        if [[ $layout == timed ]]; then
            psql -d "$database" -qc "INSERT INTO idem.idem_timed_keys (scope, key, fact_time, status, attempts, fingerprint, created_at, updated_at)
                SELECT 'ceiling', md5('fill' || g::text)::uuid, t, 'success', 1,
                       '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea, t, t
                FROM generate_series($filled + 1, $filled + $step) AS g,
                     LATERAL (SELECT now() - ($1 - g) * interval '7 days' / $1 AS t) AS at"
        else
            psql -d "$database" -qc "INSERT INTO idem.idem_keys (scope, key, status, attempts, fingerprint, created_at, updated_at)
                SELECT 'ceiling', md5('fill' || g::text)::uuid, 'success', 1,
                       '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea,
                       now() - ($1 - g) * interval '8 days' / $1, now() - ($1 - g) * interval '8 days' / $1
                FROM generate_series($filled + 1, $filled + $step) AS g"
        fi
        filled=$(( filled + step ))
    done
    psql -d "$database" -qc "VACUUM ANALYZE $table" -c "VACUUM ANALYZE order_effects"
}

# The size of the status table (its buckets, for the timed layout), indexes included.
table_size() {
    psql -d "$database" -qAtc "SELECT pg_size_pretty(coalesce(sum(pg_total_relation_size(c)), 0))
        FROM (SELECT '$table'::regclass AS c
              UNION ALL SELECT inhrelid FROM pg_inherits WHERE inhparent = '$table'::regclass) AS t"
}

# One cell: "<tps> <WAL bytes per transaction>" of script $1, right after a checkpoint.
cell() {
    local before after report tps count
    psql -d "$database" -qc "CHECKPOINT"
    before=$(psql -d "$database" -qAtc "SELECT pg_current_wal_lsn()")
    report=$(pgbench -n -M simple -D prepared=0 -c "$clients" -j 2 -T "$secs" -f "$here/$1.sql" "$database" 2>&1)
    after=$(psql -d "$database" -qAtc "SELECT pg_current_wal_lsn()")
    tps=$(awk '/^tps/ { print $3 }' <<<"$report")
    count=$(awk '/number of transactions actually processed/ { split($0, a, ": "); split(a[2], b, "/"); print b[1] }' <<<"$report")
    psql -d "$database" -qAtc "SELECT '$tps', round(pg_wal_lsn_diff('$after', '$before') / greatest($count, 1))"
}

tsv=${SCALE_TSV:-/dev/null}
printf 'keys\tround\tidem_tps\tbare_tps\tidem_wal\tbare_wal\n' >"$tsv"
echo "pgbench, c=$clients, $secs s a cell after a CHECKPOINT, $rounds rounds (the order alternating), database $database, layout $layout ($table)"
printf '%12s %12s %10s %10s %8s %12s %12s\n' keys "table+index" "idem tps" "bare tps" ratio "idem WAL/msg" "bare WAL/msg"
for size in $sizes; do
    fill_to "$size"
    bytes=$(table_size)
    for (( round = 1; round <= rounds; round++ )); do
        if (( round % 2 == 1 )); then order=("$script" bare); else order=(bare "$script"); fi
        declare -A got=()
        for shape in "${order[@]}"; do
            got[$shape]=$(cell "$shape")
        done
        read -r idem_tps idem_wal <<<"${got[$script]//|/ }"
        read -r bare_tps bare_wal <<<"${got[bare]//|/ }"
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$size" "$round" "$idem_tps" "$bare_tps" "$idem_wal" "$bare_wal" >>"$tsv"
        printf '%12s %12s %10.0f %10.0f %8.2f %12s %12s\n' "$size" "$bytes" "$idem_tps" "$bare_tps" \
            "$(awk -v a="$idem_tps" -v b="$bare_tps" 'BEGIN { print a / b }')" "$idem_wal" "$bare_wal"
        unset got
    done
done

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

largest=$(tr ' ' '\n' <<<"$sizes" | sort -n | tail -n 1)
if (( largest > 0 )) && [[ $layout == timed ]]; then
    read -r alone _ <<<"$(cell "$script" | tr '|' ' ')"
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
        "$(awk -v w="$alone_wal" 'BEGIN { print w / 1048576 }')" "$(table_size)"
elif (( largest > 0 )); then
    read -r alone _ <<<"$(cell "$script" | tr '|' ' ')"
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
