-- The business tables of the handlers that tests/testing_kit.rs tests, applied by
-- #[sqlx::test] to each test's database.

-- The payments that `apply_payment` records, one row per applied event.
CREATE TABLE payments (
    id       bigserial PRIMARY KEY,
    order_id text NOT NULL,
    cents    bigint NOT NULL
);

-- The receipts that the stand-in mail provider sent. A request that carries an
-- idempotency key already seen is ignored, as real providers do.
CREATE TABLE sent_receipts (
    id              bigserial PRIMARY KEY,
    order_id        text NOT NULL,
    idempotency_key uuid UNIQUE
);
