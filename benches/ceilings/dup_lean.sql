-- The lean reference of a duplicate: the cheapest correct answer, one read of the key's
-- row in autocommit (one round trip, no transaction block, no lock). It is also what idem
-- sends for a duplicate while duplicates are frequent in the scope (the `idem-dup`
-- scenario, once its first deliveries have turned the scope to reading first). run.sh
-- seeds keys 1 to 2000 as succeeded. Runs with -M prepared.
\set n random(1, 2000)
SELECT status, attempts, fingerprint, result, last_error FROM idem.idem_keys
WHERE scope = 'ceiling' AND key = md5(:n::text)::uuid;
