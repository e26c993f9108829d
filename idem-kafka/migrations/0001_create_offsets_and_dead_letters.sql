-- The tables of idem-kafka, in their own schema (`<idem schema>_kafka` by default).
-- Applied by `idem_kafka::migrate`, which sets `search_path` to that schema.

-- Consumer offsets stored in PostgreSQL: one row per consumer group and partition, written
-- by the handler's transaction (or the consumer's flush). Positions only move forward.
CREATE TABLE kafka_offsets (
    consumer_group  text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    next_offset     bigint NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, kafka_partition)
);

-- Messages that can never be handled, with everything needed to look at them and replay
-- them. Coordinates are unique per consumer group: a redelivered message is recorded once.
CREATE TABLE kafka_dead_letters (
    id              bigserial PRIMARY KEY,
    consumer_group  text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset    bigint NOT NULL,
    message_key     bytea,
    payload         bytea,
    reason          text NOT NULL,
    error           text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer_group, topic, kafka_partition, kafka_offset)
);
