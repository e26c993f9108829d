-- The business table of the testing chapter, which `#[sqlx::test]` applies to each test's database.
CREATE TABLE payments (id bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT NULL);
