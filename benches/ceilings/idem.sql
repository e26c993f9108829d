-- A new message through idem (the `idem` scenario): the claim, the business write, commit.
-- idem also folds an abort check into the commit's round trip; that is left out here.
\set n random(1, 1000000000000)
BEGIN;
SELECT won FROM idem.idem_claim('ceiling', md5(:n::text)::uuid, '\x00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff'::bytea, 5000);
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ('o-' || :n, 'paid', 100);
COMMIT;
