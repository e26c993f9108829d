-- The retention window a scope's handler declares (`#[idempotent(retention = "30d")]`), in
-- milliseconds: the retention cleanup deletes the scope's `success` keys after this long
-- instead of after its default window. NULL: the cleanup's default. Recorded when the
-- handler first runs in a process, so that every cleaner (another instance, `idem purge`)
-- knows it, including for handlers that have not run in its own process.
ALTER TABLE idem_scopes ADD COLUMN retention_ms bigint CHECK (retention_ms > 0);
