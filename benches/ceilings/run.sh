#!/usr/bin/env bash
# The ceilings of the bench suite's ratios, and the distance of idem's protocol to the
# cheapest SQL with the same guarantees: the same SQL shapes driven by pgbench (a C client,
# no idem, no Rust, no pool pings), side by side. A ratio printed for a pair is what the SQL
# alone allows on this machine; the suite's ratio for the same pair and concurrency lands
# near or below it (the suite adds a client and pool pings to both sides).
#
#   bash benches/ceilings/run.sh        # about 7 minutes
#
# The shapes (one script each, in this directory):
#   bare, article, idem, batch_claim, bare_batch: the suite's scenarios of those names
#     (`batch_claim` is `batch-bulk-500`), statement for statement;
#   lean: the cheapest SQL with idem's guarantees for a new message (the key's row and the
#     business row in one transaction, INSERT ... ON CONFLICT DO NOTHING RETURNING);
#   lean_checked: lean with SET LOCAL lock_timeout in BEGIN's round trip and
#     `SAVEPOINT x; COMMIT` as the abort check;
#   dup: a duplicate found by the claim; dup_lean: the cheapest correct duplicate, one read
#     of the key's row in autocommit (what idem sends while duplicates are frequent);
#   select1: one round trip that does nothing;
#   idem_previous_key: idem's new message while its handler declares `previous_key` (the
#     key under the previous definition claimed first, in the same transaction).
# pgbench's -M prepared refuses `\;` (several statements in one round trip), so the shapes
# that use it (idem, dup, lean_checked, batch_claim) run with -M simple, and prepare their
# statements once per connection themselves (PREPARE, then EXECUTE), as the runtime does;
# the others run with -M prepared.
#
# Needs pgbench 12 or later (PostgreSQL's client tools) and the bench database with its
# tables at the current migrations: run `IDEM_BENCH_QUICK=1 cargo bench --bench suite`
# once first. Connects with the libpq environment (PGHOST, PGPORT, PGUSER; default
# 127.0.0.1:5432 as postgres) to IDEM_BENCH_DATABASE (default idem_bench), whose bench
# tables it empties at the start of every round, as the suite does. CEILING_SECS sets the
# seconds per cell (10), CEILING_ROUNDS the rounds (2). Within a round the cells of a group
# run one after the other, in reverse order every other round, so that drift spreads over
# both sides of a ratio; the ratios of each round are printed side by side.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
database=${IDEM_BENCH_DATABASE:-idem_bench}
secs=${CEILING_SECS:-10}
rounds=${CEILING_ROUNDS:-2}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}

if ! command -v pgbench >/dev/null; then
    echo "ceilings: pgbench is not installed (it comes with PostgreSQL's client tools)" >&2
    exit 1
fi
pgbench_major=$(pgbench --version | awk '{ split($3, v, "."); print v[1] + 0 }')
if (( pgbench_major < 12 )); then
    echo "ceilings: pgbench $pgbench_major is too old: the scripts need \\if and -D (pgbench 12 or later)" >&2
    exit 1
fi
if ! [[ $secs =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ ]]; then
    echo "ceilings: CEILING_SECS ($secs) and CEILING_ROUNDS ($rounds) must be whole numbers above 0" >&2
    exit 1
fi
if ! psql -d "$database" -qAtc "SELECT 1 FROM idem.idem_keys, order_effects, article_messages LIMIT 0" >/dev/null 2>&1; then
    echo "ceilings: database $database has no bench tables; run 'IDEM_BENCH_QUICK=1 cargo bench --bench suite' once first" >&2
    exit 1
fi
if [[ $(psql -d "$database" -qAtc "SELECT coalesce(max(version), 0) >= 5 FROM idem._sqlx_migrations WHERE success" 2>/dev/null) != t ]]; then
    echo "ceilings: the status table of database $database predates migration 0005 (results as json, the claim as plain statements); run 'IDEM_BENCH_QUICK=1 cargo bench --bench suite' once to migrate it" >&2
    exit 1
fi

# Empties the bench tables and seeds keys 1 to 2000 as succeeded (the duplicates' keys).
seed() {
    psql -d "$database" -qc "TRUNCATE order_effects, article_messages, idem.idem_keys" -c "
        INSERT INTO idem.idem_keys (scope, key, status, attempts, fingerprint)
        SELECT 'ceiling', md5(g::text)::uuid, 'success', 1,
               '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea
        FROM generate_series(1, 2000) AS g"
}

# The shapes: the script each runs, and the protocol pgbench speaks for it.
declare -A script=(
    [bare]=bare [article]=article [lean]=lean [lean_checked]=lean_checked
    [idem]=idem [dup]=dup [dup_lean]=dup_lean [select1]=select1
    [batch_claim]=batch_claim [bare_batch]=bare_batch [idem_previous_key]=idem_previous_key
)
declare -A mode=(
    [bare]=prepared [article]=prepared [lean]=prepared [lean_checked]=simple
    [idem]=simple [dup]=simple [dup_lean]=prepared [select1]=prepared
    [batch_claim]=simple [bare_batch]=prepared [idem_previous_key]=simple
)

# The groups of cells: clients, synchronous_commit, shapes.
groups=(
    "16 on bare article lean lean_checked idem dup dup_lean select1"
    "16 off bare article lean lean_checked idem"
    "4 on bare lean lean_checked idem"
    "1 on idem lean lean_checked dup dup_lean select1"
    "4 on batch_claim bare_batch"
    "16 on idem idem_previous_key"
)

# Transactions per second of one shape: tps <shape> <clients> <synchronous_commit>
# (`prepared`: whether a client prepared the -M simple scripts' statements already).
tps() {
    local report
    if ! report=$(PGOPTIONS="-c synchronous_commit=$3" pgbench -n -M "${mode[$1]}" -D prepared=0 -c "$2" \
        -j "$(( $2 < 2 ? $2 : 2 ))" -T "$secs" -f "$here/${script[$1]}.sql" "$database" 2>&1); then
        echo "ceilings: pgbench failed on ${script[$1]}.sql (-M ${mode[$1]}, $2 clients):" >&2
        echo "$report" >&2
        exit 1
    fi
    awk '/^tps/ { print $3 }' <<<"$report"
}

declare -A result
echo "pgbench, $secs s per cell, $rounds rounds, database $database"
echo "(-M simple for idem, dup, lean_checked and batch_claim: they send several statements in one round trip, which"
echo " -M prepared refuses; they prepare their statements once per connection with PREPARE and EXECUTE)"
for (( round = 1; round <= rounds; round++ )); do
    seed
    for group in "${groups[@]}"; do
        read -r clients sync shapes <<<"$group"
        read -r -a shapes <<<"$shapes"
        if (( round % 2 == 0 )); then
            reversed=()
            for (( i = ${#shapes[@]} - 1; i >= 0; i-- )); do reversed+=("${shapes[i]}"); done
            shapes=("${reversed[@]}")
        fi
        for shape in "${shapes[@]}"; do
            value=$(tps "$shape" "$clients" "$sync")
            result[$round/$clients/$sync/$shape]=$value
            printf '  round %d/%d  c=%-3s sync=%-4s %-13s -M %-9s %9.0f tps\n' \
                "$round" "$rounds" "$clients" "$sync" "$shape" "${mode[$shape]}" "$value"
        done
    done
done

# ratio <first> <second> <clients> <synchronous_commit> <note>: the ratio of every round.
ratio() {
    local line round
    line=$(printf '  %-26s c=%-3s sync=%-4s' "$1/$2" "$3" "$4")
    for (( round = 1; round <= rounds; round++ )); do
        line+=$(awk -v a="${result[$round/$3/$4/$1]}" -v b="${result[$round/$3/$4/$2]}" \
            'BEGIN { printf " %8.2f", a / b }')
    done
    echo "$line${5:+   $5}"
}

header=$(printf '  %-26s %-15s' "ratio" "")
for (( round = 1; round <= rounds; round++ )); do header+=$(printf ' %8s' "round $round"); done
echo
echo "Ratios (the first shape's tps over the second's, each round on its own)"
echo "$header"
echo "New message: today's protocol against the cheapest SQL with the same guarantees"
ratio idem lean 16 on "the distance to the cheapest SQL"
ratio idem lean 16 off ""
ratio idem lean 1 on ""
ratio idem lean_checked 16 on "the same against lean with its checks: what the rest of idem's SQL costs"
ratio idem lean_checked 4 on ""
ratio idem lean_checked 16 off ""
ratio idem lean_checked 1 on ""
ratio lean_checked lean 16 on "what the lock timeout and the abort check cost"
ratio lean_checked lean 16 off ""
echo "New message: the suite's goals"
ratio idem bare 4 on "suite goal >= 0.75"
ratio idem bare 16 on "suite goal >= 0.75"
ratio idem bare 16 off ""
ratio lean bare 4 on "the most any protocol reaches against bare"
ratio lean bare 16 on ""
ratio lean bare 16 off ""
ratio idem article 16 on "suite goal >= 1"
ratio idem article 16 off "suite goal >= 1.3"
echo "Duplicates"
ratio dup idem 1 on "a duplicate found by the claim (claim first)"
ratio dup idem 16 on ""
ratio dup_lean idem 1 on "the cheapest correct duplicate: idem's read first, in a redelivery storm"
ratio dup_lean idem 16 on "suite goal for idem-dup/idem >= 3"
ratio dup dup_lean 1 on "claim first against read first (the ROLLBACK is a round trip of its own here)"
ratio dup dup_lean 16 on ""
ratio select1 idem 1 on "one empty round trip"
ratio select1 idem 16 on ""
echo "A declared key change"
ratio idem_previous_key idem 16 on "a new message claiming its key under both definitions"
echo "Batches of 500"
ratio batch_claim bare_batch 4 on "suite goal >= 0.6 (batch-bulk-500/bare-batch-500)"
