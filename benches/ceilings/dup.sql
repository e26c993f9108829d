-- A duplicate through PostgreSQL (the `idem-dup` scenario): the claim reads the row in the
-- way, and the transaction rolls back. run.sh seeds keys 1 to 2000 as succeeded.
\set n random(1, 2000)
BEGIN;
SELECT won FROM idem.idem_claim('ceiling', md5(:n::text)::uuid, '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea, 5000);
ROLLBACK;
