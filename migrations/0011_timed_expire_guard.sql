-- The expiry of time buckets keeps every window that a scope declares, whoever calls it.
-- Applied by `Idem::migrate` with `search_path` set to the configured schema. Replaces a
-- function with the same signature: the previous release's cleanup keeps calling it as
-- before, and gets the same answers for the windows it passes.
--
-- `window_ms` is the caller's window; the bucket expired is one whose facts are older than
-- the longest of it and of the windows the scopes' handlers declare (`retention = "..."`,
-- recorded in `idem_scopes`), so that a cleaner with a short window (an operator's one-off
-- `idem purge --older-than 1h`) never drops the keys of a scope that declared a longer
-- one. A negative window is refused: it would drop the bucket of facts that are being
-- delivered now (or ahead of now), and every fact of its hour would then be refused. A
-- window of zero drops the buckets that ended, never the current one.
CREATE OR REPLACE FUNCTION idem_timed_expire(window_ms bigint, lock_timeout_ms integer)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    doomed idem_timed_buckets;
    kept bigint;
BEGIN
    IF window_ms IS NULL OR window_ms < 0 THEN
        RAISE EXCEPTION 'idem_timed_expire: the window must be zero or more milliseconds, not %', window_ms
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT greatest(window_ms, max(retention_ms)) INTO kept FROM idem_scopes;
    PERFORM pg_advisory_xact_lock(hashtext('idem timed buckets'), hashtext(current_schema()));
    SELECT * INTO doomed FROM idem_timed_buckets AS b
    WHERE b.ends_at <= now() - kept * interval '1 millisecond'
    ORDER BY b.starts_at
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE idem_timed_horizon SET expired_before = greatest(expired_before, doomed.ends_at);
    PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
    EXECUTE format('ALTER TABLE idem_timed_keys DETACH PARTITION %I', doomed.name);
    EXECUTE format('DROP TABLE %I', doomed.name);
    DELETE FROM idem_timed_buckets WHERE starts_at = doomed.starts_at;
    RETURN doomed.name;
END
$$;
