-- Keys kept by the fact's own time: the status table of the handlers that declare
-- `event_time = "..."`, one of their key fields. Applied by `Idem::migrate` with
-- `search_path` set to the configured schema. Adds tables and functions only: the
-- statements of the previous release (which use none of them) keep working.
--
-- Every delivery of a fact carries the same time, so its key lives in exactly one bucket
-- (a partition of a range of `fact_time`), which a claim finds with one probe: a new key's
-- index is the small index of the current bucket, whatever the table holds in all. Buckets
-- are created ahead by the retention cleanup (and by a claim that finds none), and expire
-- whole: `DETACH PARTITION` and `DROP TABLE`, in constant time and WAL.
CREATE TABLE idem_timed_keys (
    -- Fixed-width columns first, then the variable ones: no alignment padding.
    key              uuid NOT NULL,
    -- The fact's time (the handler's `event_time` field), to the microsecond.
    fact_time        timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    attempts         integer NOT NULL CHECK (attempts >= 0),
    scope            text COLLATE "C" NOT NULL,
    status           text NOT NULL
                     CHECK (status IN ('processing', 'success', 'failed', 'parked')),
    fingerprint      bytea,
    result           json,
    last_error       text,
    lease_owner      uuid,
    lease_expires_at timestamptz,
    PRIMARY KEY (scope, key, fact_time)
) PARTITION BY RANGE (fact_time);

-- The buckets, as their creator made them: the range of each partition of
-- `idem_timed_keys`. Written only by the functions below.
CREATE TABLE idem_timed_buckets (
    starts_at timestamptz PRIMARY KEY,
    ends_at   timestamptz NOT NULL CHECK (ends_at > starts_at),
    name      text NOT NULL UNIQUE
);

-- The start of the oldest bucket that may exist: every bucket before it expired, and is
-- never made again, so that a fact whose key was dropped with its bucket is refused as
-- outside the window instead of running again.
CREATE TABLE idem_timed_horizon (
    only_row       boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    expired_before timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO idem_timed_horizon DEFAULT VALUES;

-- The bucket of `fact`, made if it does not exist: `exists`, `created`, or `too_old` /
-- `too_new` when `fact` is outside [now() - window_ms, now() + ahead_ms) on the database
-- clock, or before the expired horizon. A new bucket is `width` wide, aligned on
-- multiples of `width` since 2000-01-01 UTC, and clipped to its neighbours (a width
-- changed between two runs leaves no gap and no overlap).
--
-- Owned by the role that migrates (`SECURITY DEFINER`): a consumer's role needs no
-- privilege to create tables, only `EXECUTE` on this function. Creators take turns on a
-- transaction-scoped advisory lock, so concurrent ones (also through a transaction
-- pooler) make each bucket once. `ATTACH PARTITION` takes a `SHARE UPDATE EXCLUSIVE`
-- lock on the parent, which claims do not wait for.
CREATE FUNCTION idem_timed_bucket(fact timestamptz, width interval, window_ms bigint,
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
    INSERT INTO idem_timed_buckets (starts_at, ends_at, name) VALUES (lo, hi, bucket);
    RETURN 'created';
END
$$;

-- Drops the oldest bucket whose every fact is older than `window_ms` on the database
-- clock: its name, or NULL when there is none. The horizon moves past it first, in the
-- same transaction, so no claim makes it again. `DETACH PARTITION` takes an
-- `ACCESS EXCLUSIVE` lock on the parent, at most `lock_timeout_ms` (the caller tries
-- again later): claims wait for it that long at most, once per bucket.
CREATE FUNCTION idem_timed_expire(window_ms bigint, lock_timeout_ms integer)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    doomed idem_timed_buckets;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('idem timed buckets'), hashtext(current_schema()));
    SELECT * INTO doomed FROM idem_timed_buckets AS b
    WHERE b.ends_at <= now() - window_ms * interval '1 millisecond'
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

REVOKE ALL ON FUNCTION idem_timed_bucket(timestamptz, interval, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_timed_expire(bigint, integer) FROM PUBLIC;
