-- `idem_claim` again, cheaper per call, with the same decisions as in migration 0002.
--
-- * No `SET search_path` clause: a function with a SET clause saves, sets and restores
--   the setting around every call, which cost a fifth of the claim's server time. The
--   status table is named with its schema instead, written in when the function is
--   created (the schema that `Idem::migrate` puts first on `search_path`).
-- * The lock timeout is saved, set and restored by assignments, which PL/pgSQL evaluates
--   as simple expressions, where `PERFORM` ran a query through the executor.
DO $migration$
BEGIN
EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$I.idem_claim(
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
AS $body$
#variable_conflict use_column
DECLARE
    saved_lock_timeout text := pg_catalog.current_setting('lock_timeout');
    set_to text;
    existing record;
BEGIN
    set_to := pg_catalog.set_config('lock_timeout', lock_timeout_ms || 'ms', true);
    LOOP
        INSERT INTO %1$I.idem_keys AS k (scope, key, status, attempts, fingerprint)
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
        FROM %1$I.idem_keys AS k
        WHERE k.scope = claim_scope AND k.key = claim_key;
        -- Purged meanwhile: claim it afresh.
        CONTINUE WHEN NOT FOUND;

        IF existing.status = 'failed'
           AND (claim_fingerprint IS NULL OR existing.fingerprint IS NULL
                OR existing.fingerprint = claim_fingerprint) THEN
            -- Take over a failed key. The row lock queues concurrent retries; one that
            -- waited finds the key no longer `failed` and reads it again.
            UPDATE %1$I.idem_keys AS k
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
    set_to := pg_catalog.set_config('lock_timeout', saved_lock_timeout, true);
END
$body$
$function$, pg_catalog.current_schema());
END
$migration$;
