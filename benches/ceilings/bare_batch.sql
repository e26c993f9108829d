-- The bare batched business insert, 500 rows (the `bare-batch-500` scenario).
\set n random(1, 1000000000)
BEGIN;
INSERT INTO order_effects (order_id, event_type, amount_cents)
SELECT 'o-' || :n || '-' || g, 'paid', 100 FROM generate_series(1, 500) AS g;
COMMIT;
