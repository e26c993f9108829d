#!/usr/bin/env bash
# The ceilings of the bench suite's ratios: the same SQL shapes driven by pgbench (a C
# client, no idem, no Rust, no pool pings), side by side. The ratio printed for a pair is
# what the SQL alone allows on this machine; the suite's ratio for the same pair and
# concurrency lands near or below it (the suite adds a client and pool pings to both sides).
#
#   bash benches/ceilings/run.sh        # about 4 minutes
#
# Needs pgbench (PostgreSQL's client tools) and the bench database with its tables: run
# `cargo bench --bench suite` once first (IDEM_BENCH_QUICK=1 is enough). Connects with the
# libpq environment (PGHOST, PGPORT, PGUSER; default 127.0.0.1:5432 as postgres) to
# IDEM_BENCH_DATABASE (default idem_bench), whose bench tables it empties first, as the
# suite does. CEILING_SECS sets the seconds per cell (10).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
database=${IDEM_BENCH_DATABASE:-idem_bench}
secs=${CEILING_SECS:-10}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}

if ! command -v pgbench >/dev/null; then
    echo "ceilings: pgbench is not installed (it comes with PostgreSQL's client tools)" >&2
    exit 1
fi
if ! psql -d "$database" -qAtc "SELECT 1 FROM idem.idem_keys, order_effects, article_messages LIMIT 0" >/dev/null 2>&1; then
    echo "ceilings: database $database has no bench tables; run 'IDEM_BENCH_QUICK=1 cargo bench --bench suite' once first" >&2
    exit 1
fi

psql -d "$database" -qc "TRUNCATE order_effects, article_messages, idem.idem_keys" -c "
    INSERT INTO idem.idem_keys (scope, key, status, attempts, fingerprint)
    SELECT 'ceiling', md5(g::text)::uuid, 'success', 1,
           '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea
    FROM generate_series(1, 2000) AS g"

# Transactions per second of one script: tps <script> <clients> <synchronous_commit>
tps() {
    local report
    if ! report=$(PGOPTIONS="-c synchronous_commit=$3" pgbench -n -M prepared -c "$2" \
        -j "$(( $2 < 2 ? $2 : 2 ))" -T "$secs" -f "$here/$1.sql" "$database" 2>&1); then
        echo "ceilings: pgbench failed on $1.sql:" >&2
        echo "$report" >&2
        exit 1
    fi
    awk '/^tps/ { print $3 }' <<<"$report"
}

# pair <first> <second> <clients> <synchronous_commit> <what the suite's goal is>
pair() {
    local first second
    first=$(tps "$1" "$3" "$4")
    second=$(tps "$2" "$3" "$4")
    awk -v a="$first" -v b="$second" -v name="$1/$2" -v c="$3" -v sync="$4" -v goal="$5" \
        'BEGIN { printf "%-24s c=%-3s sync=%-4s %9.0f / %9.0f tps = %5.2f   (suite goal %s)\n", name, c, sync, a, b, a / b, goal }'
}

echo "pgbench, $secs s per cell, database $database"
pair idem bare 16 on ">= 0.75"
pair idem bare 16 off "none"
pair idem article 16 on ">= 1"
pair idem article 16 off ">= 1.3"
pair dup idem 1 on ">= 10"
pair dup idem 16 on ">= 10"
pair select1 idem 1 on "none: one empty round trip"
pair select1 idem 16 on "none: one empty round trip"
pair batch_claim bare_batch 4 on ">= 0.6"
