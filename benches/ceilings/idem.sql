-- A new message through idem (the `idem` scenario), statement for statement as the runtime
-- sends it: `BEGIN; SET LOCAL lock_timeout` in one round trip; the claim (one insert that
-- returns the transaction's id and sets the session's lock timeout back for the body); the
-- business write; the commit's round trip (`SAVEPOINT`, which fails in an aborted
-- transaction and outside a transaction block, then COMMIT). Nothing follows the commit.
--
-- Runs with -M simple: `\;` joins statements into one round trip, which -M prepared
-- refuses. The runtime prepares the claim and the business write; so does this script,
-- once per connection (PREPARE, then EXECUTE), with the lock timeout the body gets back
-- ('0', the default) as the claim's last argument. run.sh defines `prepared` as 0.
\set n random(1, 9000000000000000000)
\if :prepared = 0
PREPARE claim (text, uuid, bytea, text) AS
INSERT INTO idem.idem_keys AS k (scope, key, status, attempts, fingerprint)
VALUES ($1, $2, 'success', 1, $3)
ON CONFLICT (scope, key) DO NOTHING
RETURNING pg_current_xact_id()::text::bigint AS xid,
          set_config('lock_timeout', $4, true) AS restored;
PREPARE effect (text, text, bigint) AS
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3);
\set prepared 1
\endif
BEGIN \; SET LOCAL lock_timeout = '5000ms';
EXECUTE claim('ceiling', md5(:n::text)::uuid,
              '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', '0');
EXECUTE effect('o-' || :n, 'paid', 100);
SAVEPOINT idem_commit_check \; COMMIT;
