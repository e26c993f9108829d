-- The bare business transaction (the `bare` scenario).
\set n random(1, 1000000000000)
BEGIN;
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ('o-' || :n, 'paid', 100);
COMMIT;
