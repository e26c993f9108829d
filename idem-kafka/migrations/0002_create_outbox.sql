-- The transactional outbox: records that a handler's body wrote in its own transaction,
-- with the claim of its key and its effects, published to Kafka by the relay once that
-- transaction committed (`idem_kafka::outbox`).
CREATE TABLE kafka_outbox (
    -- The order of publication within a shard. Records of one Kafka key are written under
    -- a lock held to their transaction's end, so their ids follow their commits.
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The outbox partition: one relay publishes a shard at a time. Every record of a
    -- topic and Kafka key is in the same shard.
    shard            smallint NOT NULL,
    topic            text NOT NULL,
    -- NULL: the producer's partitioner places the record by its Kafka key.
    kafka_partition  integer,
    record_key       bytea,
    payload          bytea,
    header_names     text[] NOT NULL,
    header_values    bytea[] NOT NULL,
    -- The record's idempotency key, published in the header `idem-key`.
    idem_key         uuid NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- When the broker acknowledged it; NULL until then.
    sent_at          timestamptz,
    -- Publications that failed, the last failure's text, and when the record was set
    -- aside for good (a topic that does not exist, a record too large, too many failures).
    attempts         integer NOT NULL DEFAULT 0,
    last_error       text,
    parked_at        timestamptz
);

-- What the relay publishes next, per shard, in order.
CREATE INDEX kafka_outbox_unsent ON kafka_outbox (shard, id)
    WHERE sent_at IS NULL AND parked_at IS NULL;

-- Which relay publishes a shard: a lease on the database clock, renewed while it runs and
-- taken over by another process once it expired.
CREATE TABLE kafka_outbox_relays (
    shard       smallint PRIMARY KEY,
    owner       uuid NOT NULL,
    expires_at  timestamptz NOT NULL
);
