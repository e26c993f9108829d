-- The article's algorithm by hand (the `article` scenario).
\set n random(1, 1000000000000)
BEGIN;
INSERT INTO article_messages (msg_id, status) VALUES (md5(:n::text)::uuid, 'processing') ON CONFLICT DO NOTHING;
SELECT status FROM article_messages WHERE msg_id = md5(:n::text)::uuid FOR UPDATE;
INSERT INTO order_effects (order_id, event_type, amount_cents) VALUES ('o-' || :n, 'paid', 100);
UPDATE article_messages SET status = 'success', updated_at = now() WHERE msg_id = md5(:n::text)::uuid;
COMMIT;
