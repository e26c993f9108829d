-- The status tables without CHECK constraints on their rows. Applied by `Idem::migrate`
-- with `search_path` set to the configured schema.
--
-- PostgreSQL reads a table's CHECK constraints from the catalog's text and plans them at
-- the start of every statement that writes the table, and evaluates them on every row:
-- on a claim's one-row insert that was a third of the insert's server time. The rows are
-- written only by idem's store, whose statements give `status` one of its four values and
-- `attempts` a count from 1; the constraints checked nothing a statement could get wrong.
-- A time bucket's own range constraint, which let `ATTACH PARTITION` skip its scan, is
-- dropped once the bucket is attached: the partition's bound keeps the range from then on.
--
-- The previous release's statements do not depend on the constraints, and keep working.
--
-- `ALTER TABLE ... DROP CONSTRAINT` takes an `ACCESS EXCLUSIVE` lock for a moment (the
-- catalog alone changes). It is asked for at most one second at a time: claims never wait
-- behind it for longer, even while a long transaction holds the table; the lock is asked
-- again after a pause, for up to three minutes before the migration fails.
DO $migration$
DECLARE
    tries integer := 0;
    saved_lock_timeout text := current_setting('lock_timeout');
    bucket text;
BEGIN
    LOOP
        BEGIN
            PERFORM set_config('lock_timeout', '1s', true);
            ALTER TABLE idem_keys
                DROP CONSTRAINT IF EXISTS idem_keys_status_check,
                DROP CONSTRAINT IF EXISTS idem_keys_attempts_check;
            -- From the buckets too: theirs are the parent's, inherited at `ATTACH`.
            ALTER TABLE idem_timed_keys
                DROP CONSTRAINT IF EXISTS idem_timed_keys_status_check,
                DROP CONSTRAINT IF EXISTS idem_timed_keys_attempts_check;
            FOR bucket IN SELECT b.name FROM idem_timed_buckets AS b LOOP
                EXECUTE format('ALTER TABLE %I DROP CONSTRAINT IF EXISTS %I', bucket, bucket || '_range');
            END LOOP;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            tries := tries + 1;
            IF tries >= 90 THEN
                RAISE;
            END IF;
            PERFORM pg_sleep(1 + random());
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', saved_lock_timeout, true);
END
$migration$;

-- `idem_timed_bucket` as migration 0010 made it, but the bucket's range constraint is
-- dropped once the bucket is attached (the table is new and not yet visible to any other
-- transaction: nothing waits for its lock).
CREATE OR REPLACE FUNCTION idem_timed_bucket(fact timestamptz, width interval, window_ms bigint,
                                             ahead_ms bigint)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    horizon timestamptz;
    lo      timestamptz;
    hi      timestamptz;
    bucket  text;
BEGIN
    IF fact < now() - window_ms * interval '1 millisecond' THEN
        RETURN 'too_old';
    END IF;
    IF fact >= now() + ahead_ms * interval '1 millisecond' THEN
        RETURN 'too_new';
    END IF;
    IF width < interval '1 minute' OR width > interval '1 day' THEN
        RAISE EXCEPTION 'idem: a bucket is a minute to a day wide, not %', width
            USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('idem timed buckets'), hashtext(current_schema()));
    SELECT h.expired_before INTO horizon FROM idem_timed_horizon AS h;
    IF fact < horizon THEN
        RETURN 'too_old';
    END IF;
    IF EXISTS (SELECT FROM idem_timed_buckets AS b WHERE b.starts_at <= fact AND fact < b.ends_at) THEN
        RETURN 'exists';
    END IF;
    lo := date_bin(width, fact, timestamptz '2000-01-01 00:00:00+00');
    hi := lo + width;
    lo := greatest(lo, horizon,
                   (SELECT max(b.ends_at) FROM idem_timed_buckets AS b WHERE b.ends_at <= fact));
    hi := least(hi, (SELECT min(b.starts_at) FROM idem_timed_buckets AS b WHERE b.starts_at > fact));
    bucket := 'idem_timed_keys_' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISS');
    EXECUTE format('CREATE TABLE %I (LIKE idem_timed_keys INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                   bucket);
    -- The partition's own constraint: `ATTACH` then needs no scan to prove it.
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (fact_time >= %L AND fact_time < %L)',
                   bucket, bucket || '_range', lo, hi);
    EXECUTE format('ALTER TABLE %I SET (autovacuum_vacuum_insert_scale_factor = 0.05)', bucket);
    EXECUTE format('ALTER TABLE idem_timed_keys ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   bucket, lo, hi);
    -- Attached: the bound holds the range now, and a claim need not check it again.
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', bucket, bucket || '_range');
    INSERT INTO idem_timed_buckets (starts_at, ends_at, name) VALUES (lo, hi, bucket);
    RETURN 'created';
END
$$;
