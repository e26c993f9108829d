-- A batch handler's transaction, 500 new messages (the `batch-bulk-500` scenario): one
-- statement claims the keys in key order, one multi-row insert writes the effects.
\set n random(1, 1000000000)
BEGIN;
WITH claimed AS (
    INSERT INTO idem.idem_keys AS k (scope, key, status, attempts, fingerprint)
    SELECT 'ceiling', key, 'success', 1, '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea
    FROM (SELECT md5(:n || '-' || g)::uuid AS key FROM generate_series(1, 500) AS g) AS keys
    ORDER BY key
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING k.key)
SELECT count(*) FROM claimed;
INSERT INTO order_effects (order_id, event_type, amount_cents)
SELECT 'o-' || :n || '-' || g, 'paid', 100 FROM generate_series(1, 500) AS g;
COMMIT;
