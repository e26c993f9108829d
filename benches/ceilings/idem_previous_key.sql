-- A new message through idem while its handler declares `previous_key` (a key change in
-- progress), statement for statement as the runtime sends it: the `idem` shape with the
-- claim of the message's key under the previous definition first, in the same
-- transaction, keeping the claim's lock timeout for the second claim. What a declared
-- key change costs a new message, next to `idem`.
--
-- Runs with -M simple, preparing its statements once per connection, as idem.sql does.
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
EXECUTE claim('ceiling', md5('previous' || :n::text)::uuid,
              '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', '5000ms');
EXECUTE claim('ceiling', md5(:n::text)::uuid,
              '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', '0');
EXECUTE effect('o-' || :n, 'paid', 100);
SAVEPOINT idem_commit_check \; COMMIT;
