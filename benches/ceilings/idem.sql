-- A new message through idem (the `idem` scenario), statement for statement as the runtime
-- sends it: `BEGIN; SET LOCAL lock_timeout` in one round trip; the claim (one insert that
-- returns the transaction's id and sets the session's lock timeout back for the body, or
-- else reads the row in the way); the business write; the commit's round trip (a check that
-- the transaction is still the claim's and not aborted, COMMIT, and a BEGIN for the
-- client's transaction guard). The guard rolls that empty transaction back with the
-- connection's next use; pgbench cannot end a script inside a transaction, so its ROLLBACK
-- rides in the commit's round trip here.
--
-- Runs with -M simple: `\;` joins statements into one round trip, which -M prepared
-- refuses. The runtime prepares the claim and the business write; so does this script,
-- once per connection (PREPARE, then EXECUTE), with the lock timeout the body gets back
-- ('0', the default) as the claim's last argument. run.sh defines `prepared` as 0.
\set n random(1, 9000000000000000000)
\if :prepared = 0
PREPARE claim (text, uuid, bytea, text) AS
WITH claimed AS (
    INSERT INTO idem.idem_keys AS k (scope, key, status, attempts, fingerprint)
    VALUES ($1, $2, 'success', 1, $3)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING pg_current_xact_id()::text::bigint AS xid,
              set_config('lock_timeout', $4, true) AS restored)
SELECT xid, NULL::text AS status, NULL::integer AS attempts, NULL::bytea AS fingerprint,
       NULL::json AS result, NULL::text AS last_error
FROM claimed
UNION ALL
SELECT NULL, k.status, k.attempts, k.fingerprint, k.result, k.last_error
FROM idem.idem_keys AS k
WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT FROM claimed);
PREPARE effect (text, text, bigint) AS
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3);
\set prepared 1
\endif
BEGIN \; SET LOCAL lock_timeout = '5000ms';
EXECUTE claim('ceiling', md5(:n::text)::uuid,
              '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', '0') \gset
EXECUTE effect('o-' || :n, 'paid', 100);
SELECT 1 / coalesce(pg_current_xact_id_if_assigned() = :xid::text::xid8, false)::int \; COMMIT \; BEGIN \; ROLLBACK;
