-- A new message through idem whose body sends one record through idem-kafka's outbox
-- (`outbox::send`), statement for statement as the runtime sends it: idem.sql, with the
-- send's own round trip (the prepared statement that notes the send in the transaction,
-- so that a savepoint the body rolls back takes the record back), and the record written
-- in the commit's round trip (idem's lock timeout, the lock on its topic and Kafka key if
-- the send is still noted, then the row if it is), between the check and COMMIT, as the
-- runtime does for a body's records. The payload is 200 bytes, as in benches/outbox.rs.
--
-- Runs with -M simple (see idem.sql); needs idem-kafka's tables (`idem_kafka.kafka_outbox`).
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
PREPARE note (text, text) AS
SELECT strpos(v, $1) > 0 AS again,
       set_config('idem_outbox.sent', CASE WHEN strpos(v, $1) > 0 THEN v ELSE v || $2 END, true) AS noted
FROM (SELECT coalesce(current_setting('idem_outbox.sent', true), '') AS v) AS sent;
\set prepared 1
\endif
BEGIN \; SET LOCAL lock_timeout = '5000ms';
EXECUTE claim('ceiling', md5(:n::text)::uuid,
              '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff', '0');
EXECUTE effect('o-' || :n, 'paid', 100);
EXECUTE note(',k' || md5('out' || :n), ',t' || :n || ',k' || md5('out' || :n));
SAVEPOINT idem_commit_check \; SET LOCAL lock_timeout = '5000ms' \; SELECT CASE WHEN strpos(coalesce(current_setting('idem_outbox.sent', true), '') || ',', ',t' || :n || ',') > 0 THEN pg_advisory_xact_lock(501222156, hashtext(:n::text)) END \; INSERT INTO idem_kafka.kafka_outbox (shard, topic, kafka_partition, record_key, payload, header_names, header_values, idem_key) SELECT 3::int2, convert_from('\x7265636569707473'::bytea, 'UTF8'), NULL::int4, convert_to('o-' || :n, 'UTF8'), convert_to(repeat('x', 200), 'UTF8'), ARRAY[]::text[]::text[], ARRAY[]::bytea[]::bytea[], md5('out' || :n)::uuid WHERE strpos(coalesce(current_setting('idem_outbox.sent', true), '') || ',', ',t' || :n || ',') > 0 \; COMMIT;
