-- The status table of idem: one row per (handler scope, idempotency key).
-- Applied by `Idem::migrate`, which sets `search_path` to the configured schema.
--
-- Rows are written by the transaction that runs the handler, so a row is only ever
-- visible once the handler's effects are committed (transactional mode), or as a
-- lease that expires on the database clock (lease mode).
CREATE TABLE idem_keys (
    scope            text COLLATE "C" NOT NULL,
    key              uuid NOT NULL,
    status           text NOT NULL
                     CHECK (status IN ('processing', 'success', 'failed', 'parked')),
    -- Executions that ran the body (successful or not).
    attempts         integer NOT NULL CHECK (attempts >= 0),
    -- SHA-256 of the declared payload fields; NULL when the handler declares none.
    fingerprint      bytea,
    -- The handler's result, replayed to duplicates (JSON); NULL when not stored.
    result           jsonb,
    last_error       text,
    -- Lease mode: the owner token (fencing token) and the expiry, on the database clock.
    lease_owner      uuid,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, key)
);

-- For retention (purging old keys). Only columns that never change are indexed, so that
-- status updates stay HOT updates.
CREATE INDEX idem_keys_created_at_idx ON idem_keys (created_at);
