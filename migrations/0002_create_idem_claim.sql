-- The claim of one key in transaction mode, as one call: the whole decision runs inside
-- the server with plans cached per session, so a delivery pays one round trip for it.
-- Applied by `Idem::migrate` with `search_path` set to the configured schema, which
-- `SET search_path FROM CURRENT` pins for every call.
--
-- Returns `won` when the calling transaction now holds the key: it inserted the key as
-- `success`, or took over a `failed` key whose fingerprint matches. The key only becomes
-- visible when the caller commits, together with the handler's effects; a rollback
-- releases it. Otherwise returns the row in the way, read without a lock and without a
-- write. A concurrent claim of the same key waits in its INSERT for this transaction,
-- at most `lock_timeout_ms`; the session's own lock timeout is restored for the handler.
CREATE FUNCTION idem_claim(
    claim_scope       text,
    claim_key         uuid,
    claim_fingerprint bytea,
    lock_timeout_ms   integer,
    OUT won           boolean,
    OUT status        text,
    OUT attempts      integer,
    OUT fingerprint   bytea,
    OUT result        jsonb,
    OUT last_error    text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    saved_lock_timeout text := current_setting('lock_timeout');
    existing record;
BEGIN
    PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
    LOOP
        INSERT INTO idem_keys AS k (scope, key, status, attempts, fingerprint)
        VALUES (claim_scope, claim_key, 'success', 1, claim_fingerprint)
        ON CONFLICT (scope, key) DO NOTHING
        RETURNING k.attempts INTO attempts;
        IF FOUND THEN
            won := true;
            EXIT;
        END IF;

        -- A new snapshot: it sees the row of a claim that committed while the INSERT waited.
        SELECT k.status, k.attempts, k.fingerprint, k.result, k.last_error
        INTO existing
        FROM idem_keys AS k
        WHERE k.scope = claim_scope AND k.key = claim_key;
        -- Purged meanwhile: claim it afresh.
        CONTINUE WHEN NOT FOUND;

        IF existing.status = 'failed'
           AND (claim_fingerprint IS NULL OR existing.fingerprint IS NULL
                OR existing.fingerprint = claim_fingerprint) THEN
            -- Take over a failed key. The row lock queues concurrent retries; one that
            -- waited finds the key no longer `failed` and reads it again.
            UPDATE idem_keys AS k
            SET status = 'success', attempts = k.attempts + 1, updated_at = now()
            WHERE k.scope = claim_scope AND k.key = claim_key AND k.status = 'failed'
            RETURNING k.attempts INTO attempts;
            IF FOUND THEN
                won := true;
                EXIT;
            END IF;
            CONTINUE;
        END IF;

        won := false;
        status := existing.status;
        attempts := existing.attempts;
        fingerprint := existing.fingerprint;
        result := existing.result;
        last_error := existing.last_error;
        EXIT;
    END LOOP;
    PERFORM set_config('lock_timeout', saved_lock_timeout, true);
END
$$;
