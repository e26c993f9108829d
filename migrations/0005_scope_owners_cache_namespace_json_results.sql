-- Who owns each scope, the cache namespace of this status table, and results that hold
-- any JSON. Applied by `Idem::migrate` with `search_path` set to the configured schema.

-- One row per scope: the crate that declared its handler, recorded the first time a
-- handler of the scope runs. A handler of another crate that uses the same scope is
-- refused (`Error::ScopeConflict`), unless both declare the scope shared. `shared` scopes
-- record no owner.
CREATE TABLE idem_scopes (
    scope      text COLLATE "C" PRIMARY KEY,
    owner      text,
    shared     boolean NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (shared = (owner IS NULL))
);

-- A random identity of this status table (one database, one schema). The Redis cache
-- writes its entries under it, so that handles on other databases or schemas that share
-- a Redis never answer each other's keys.
CREATE TABLE idem_instance (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO idem_instance DEFAULT VALUES;

-- `jsonb` refuses strings with U+0000 (`\u0000`), which serde_json writes for a NUL
-- character: a handler result holding one failed every commit. `json` keeps the text as
-- written (and costs less to write); results are only stored and read back whole.
ALTER TABLE idem_keys ALTER COLUMN result TYPE json USING result::json;

-- The claim function of migrations 0002 and 0004 is replaced by plain statements.
DROP FUNCTION idem_claim(text, uuid, bytea, integer);
