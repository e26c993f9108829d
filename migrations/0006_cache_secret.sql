-- The secret that signs the Redis cache's entries of this status table (HMAC-SHA256):
-- an entry that anyone else wrote into Redis does not verify, is a miss, and never skips
-- a body. 32 bytes from PostgreSQL's strong random source. Rotating it
-- (`UPDATE idem_instance SET cache_secret = ...`) invalidates the cache and nothing else;
-- handles read it when they first use the cache.
ALTER TABLE idem_instance
    ADD COLUMN cache_secret bytea NOT NULL
    DEFAULT (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));
