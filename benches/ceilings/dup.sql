-- A duplicate found by the claim (idem's claim-first order, taken while duplicates are
-- rare in the scope): `BEGIN; SET LOCAL lock_timeout` in one round trip, the claim's
-- insert, which returns no row (the key is in the way), the takeover statement, which finds
-- a success (no row written, no lock taken) and returns it, and the ROLLBACK, which the
-- runtime sends from a task of its own once the delivery has its answer. run.sh seeds keys
-- 1 to 2000 as succeeded.
--
-- Runs with -M simple, the statements prepared once per connection (see idem.sql).
\set n random(1, 2000)
\if :prepared = 0
PREPARE claim (text, uuid, bytea, text) AS
INSERT INTO idem.idem_keys AS k (scope, key, status, attempts, fingerprint)
VALUES ($1, $2, 'success', 1, $3)
ON CONFLICT (scope, key) DO NOTHING
RETURNING pg_current_xact_id()::text::bigint AS xid,
          set_config('lock_timeout', $4, true) AS restored;
PREPARE takeover (text, uuid, bytea, text) AS
WITH claimed AS (
    UPDATE idem.idem_keys AS k
    SET status = 'success', attempts = k.attempts + 1, updated_at = now(),
        fingerprint = coalesce(k.fingerprint, $3)
    WHERE k.scope = $1 AND k.key = $2 AND k.status = 'failed'
      AND ($3::bytea IS NULL OR k.fingerprint IS NULL OR k.fingerprint = $3)
    RETURNING pg_current_xact_id()::text::bigint AS xid,
              set_config('lock_timeout', $4, true) AS restored)
SELECT xid, NULL::text AS status, NULL::integer AS attempts, NULL::bytea AS fingerprint,
       NULL::json AS result, NULL::text AS last_error
FROM claimed
UNION ALL
SELECT NULL, k.status, k.attempts, k.fingerprint, k.result, k.last_error
FROM idem.idem_keys AS k
WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS (SELECT FROM claimed);
\set prepared 1
\endif
BEGIN \; SET LOCAL lock_timeout = '5000ms';
EXECUTE claim('ceiling', md5(:n::text)::uuid,
              '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', '0');
EXECUTE takeover('ceiling', md5(:n::text)::uuid,
                 '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', '0');
ROLLBACK;
