-- lean.sql with the two checks idem adds, at no extra round trip: SET LOCAL lock_timeout
-- in BEGIN's round trip (a claim waits behind an in-flight one at most that long), and
-- `SAVEPOINT x; COMMIT` as the abort check: in an aborted transaction the SAVEPOINT fails,
-- where a bare COMMIT would roll back without an error, and it fails outside a transaction
-- block too (a body that ended the transaction itself), where `SELECT 1` would not. Same
-- round trips as lean.sql.
--
-- Runs with -M simple: `\;` joins statements into one round trip, which -M prepared
-- refuses. The two inserts are prepared once per connection (PREPARE, then EXECUTE), as in
-- idem.sql.
\set n random(1, 9000000000000000000)
\if :prepared = 0
PREPARE claim (text, uuid, bytea) AS
INSERT INTO idem.idem_keys (scope, key, status, attempts, fingerprint)
VALUES ($1, $2, 'success', 1, $3)
ON CONFLICT (scope, key) DO NOTHING
RETURNING true AS won;
PREPARE effect (text, text, bigint) AS
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3);
\set prepared 1
\endif
BEGIN \; SET LOCAL lock_timeout = '5000ms';
EXECUTE claim('ceiling', md5(:n::text)::uuid,
              '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff');
EXECUTE effect('o-' || :n, 'paid', 100);
SAVEPOINT idem_commit_check \; COMMIT;
