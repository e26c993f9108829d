-- The lean reference of a new message: the cheapest SQL with idem's guarantees. The key's
-- row and the business row in one transaction, and RETURNING tells the winner it won (a
-- concurrent claimer waits in its INSERT, then sees the conflict). No lock timeout, no
-- abort check. Runs with -M prepared.
\set n random(1, 9000000000000000000)
BEGIN;
INSERT INTO idem.idem_keys (scope, key, status, attempts, fingerprint)
VALUES ('ceiling', md5(:n::text)::uuid, 'success', 1,
        '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea)
ON CONFLICT (scope, key) DO NOTHING
RETURNING true AS won;
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ('o-' || :n, 'paid', 100);
COMMIT;
