#!/usr/bin/env bash
# What a new message costs as the status table grows: idem's new-message SQL (idem.sql)
# and the bare business transaction (bare.sql) side by side, at each size of the status
# table, with the write-ahead log each writes per message. The table is filled with SQL
# (SHA-like random keys, as digests are), then vacuumed and checkpointed, so that every
# cell starts right after a checkpoint, as a long-running consumer's minutes do.
#
#   bash benches/ceilings/scale.sh                  # sizes 0, 5M and 20M keys, about 15 minutes
#   SCALE_SIZES="0 5000000" SCALE_SECS=20 SCALE_ROUNDS=2 bash benches/ceilings/scale.sh
#
# Uses its own database (SCALE_DATABASE, default idem_scale; dropped and made again at the
# start, dropped at the end unless SCALE_KEEP=1), migrated with the `idem` command line
# (`cargo run -p idem-cli`). Connects with the libpq environment (PGHOST, PGPORT, PGUSER;
# default 127.0.0.1:5432 as postgres). 20 million keys take about 3.6 GB of disk.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
database=${SCALE_DATABASE:-idem_scale}
sizes=${SCALE_SIZES:-"0 5000000 20000000"}
secs=${SCALE_SECS:-30}
rounds=${SCALE_ROUNDS:-2}
clients=${SCALE_CLIENTS:-16}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}

for tool in pgbench psql createdb dropdb cargo; do
    command -v "$tool" >/dev/null || { echo "scale: '$tool' is missing" >&2; exit 1; }
done

dropdb --if-exists "$database"
createdb "$database"
cleanup() { [[ ${SCALE_KEEP:-0} == 1 ]] || dropdb --if-exists "$database"; }
trap cleanup EXIT
cargo run -q --manifest-path "$root/Cargo.toml" -p idem-cli -- \
    -D "postgres://$PGUSER@$PGHOST:$PGPORT/$database" migrate >/dev/null
psql -d "$database" -qc "CREATE TABLE order_effects (id bigserial PRIMARY KEY, order_id text NOT NULL,
                         event_type text NOT NULL, amount_cents bigint NOT NULL)"

# Grows the status table to $1 keys, in steps of a million (one transaction each).
fill_to() {
    local have
    have=$(psql -d "$database" -qAtc "SELECT count(*) FROM idem.idem_keys")
    while (( have < $1 )); do
        local step=$(( $1 - have < 1000000 ? $1 - have : 1000000 ))
        psql -d "$database" -qc "INSERT INTO idem.idem_keys (scope, key, status, attempts, fingerprint)
            SELECT 'ceiling', md5('fill' || g::text)::uuid, 'success', 1,
                   '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea
            FROM generate_series($have + 1, $have + $step) AS g"
        have=$(( have + step ))
    done
    psql -d "$database" -qc "VACUUM ANALYZE idem.idem_keys" -c "VACUUM ANALYZE order_effects"
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

echo "pgbench, c=$clients, $secs s a cell after a CHECKPOINT, $rounds rounds (the order alternating), database $database"
printf '%12s %12s %10s %10s %8s %12s %12s\n' keys "table+index" "idem tps" "bare tps" ratio "idem WAL/msg" "bare WAL/msg"
for size in $sizes; do
    fill_to "$size"
    bytes=$(psql -d "$database" -qAtc "SELECT pg_size_pretty(pg_total_relation_size('idem.idem_keys'))")
    for (( round = 1; round <= rounds; round++ )); do
        if (( round % 2 == 1 )); then order=(idem bare); else order=(bare idem); fi
        declare -A got=()
        for shape in "${order[@]}"; do
            got[$shape]=$(cell "$shape")
        done
        read -r idem_tps idem_wal <<<"${got[idem]//|/ }"
        read -r bare_tps bare_wal <<<"${got[bare]//|/ }"
        printf '%12s %12s %10.0f %10.0f %8.2f %12s %12s\n' "$size" "$bytes" "$idem_tps" "$bare_tps" \
            "$(awk -v a="$idem_tps" -v b="$bare_tps" 'BEGIN { print a / b }')" "$idem_wal" "$bare_wal"
        unset got
    done
done
