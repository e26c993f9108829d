-- A new message through idem with keys kept by the fact's time (`event_time`), statement
-- for statement as the runtime sends it: the claim of idem-runtime's store/timed.rs (one
-- insert into the fact's bucket, only inside the window), the business write, the commit's
-- round trip. The fact happened up to 5 s before it is handled (`now()` minus a jitter).
-- Same conventions as idem.sql (-M simple, PREPARE once per connection).
\set n random(1, 9000000000000000000)
\set late random(0, 5000)
\if :prepared = 0
PREPARE claim (text, uuid, bytea, text, timestamptz, bigint, bigint) AS
INSERT INTO idem.idem_timed_keys AS k (scope, key, fact_time, status, attempts, fingerprint)
SELECT $1::text, $2::uuid, $5::timestamptz, 'success', 1, $3::bytea
WHERE ($5::timestamptz >= now() - $6::bigint * interval '1 millisecond'
       AND $5::timestamptz < now() + $7::bigint * interval '1 millisecond')
ON CONFLICT (scope, key, fact_time) DO NOTHING
RETURNING pg_current_xact_id()::text::bigint AS xid,
          set_config('lock_timeout', $4, true) AS restored;
PREPARE effect (text, text, bigint) AS
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ($1, $2, $3);
\set prepared 1
\endif
BEGIN \; SET LOCAL lock_timeout = '5000ms';
EXECUTE claim('ceiling', md5(:n::text)::uuid,
              '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', '0',
              now() - :late * interval '1 millisecond', 604800000, 3600000);
EXECUTE effect('o-' || :n, 'paid', 100);
SAVEPOINT idem_commit_check \; COMMIT;
