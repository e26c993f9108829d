-- A batch handler's transaction, 500 new messages (the `batch-bulk-500` scenario), as the
-- runtime sends it: `BEGIN; SET LOCAL lock_timeout` in one round trip; one statement
-- claims the keys in key order and reads the rows in the way (none here), as arrays in one
-- row; one multi-row insert writes the effects; the commit's round trip with the abort
-- check (see idem.sql). The
-- runtime binds the keys and fingerprints as arrays; the statements here compute them.
--
-- Runs with -M simple, the two statements prepared once per connection (see idem.sql).
\set n random(1, 9000000000000000000)
\if :prepared = 0
PREPARE claim (text, bigint, text) AS
WITH input AS (
    SELECT md5($2 || '-' || g)::uuid AS key,
           '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea AS fingerprint
    FROM generate_series(1, 500) AS g),
claimed AS (
    INSERT INTO idem.idem_keys (scope, key, status, attempts, fingerprint)
    SELECT $1, key, 'success', 1, fingerprint FROM input ORDER BY key
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING key),
lost AS (
    SELECT i.key FROM input i WHERE NOT EXISTS (SELECT FROM claimed c WHERE c.key = i.key))
SELECT (SELECT pg_current_xact_id_if_assigned()::text::bigint FROM claimed LIMIT 1) AS xid,
       CASE WHEN coalesce(bool_and(k.status IS DISTINCT FROM 'failed'), true)
            THEN set_config('lock_timeout', $3, true) END AS restored,
       array_agg(l.key) AS keys, array_agg(k.status) AS statuses,
       array_agg(k.attempts) AS attempts, array_agg(k.fingerprint) AS fingerprints,
       array_agg(k.result) AS results, array_agg(k.last_error) AS last_errors
FROM lost l
LEFT JOIN idem.idem_keys k ON k.scope = $1 AND k.key = l.key;
PREPARE effects (bigint) AS
INSERT INTO order_effects (order_id, event_type, amount_cents)
SELECT 'o-' || $1 || '-' || g, 'paid', 100 FROM generate_series(1, 500) AS g;
\set prepared 1
\endif
BEGIN \; SET LOCAL lock_timeout = '5000ms';
EXECUTE claim('ceiling', :n, '0');
EXECUTE effects(:n);
SAVEPOINT idem_commit_check \; COMMIT;
