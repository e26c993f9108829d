//! The consumer's tracing spans, after the OpenTelemetry messaging conventions.
//!
//! Each message (or batch) is handled in a span `process` whose `otel.name` is
//! `process <topic>`, with `otel.kind = "consumer"`, `messaging.system = "kafka"`,
//! `messaging.operation.type = "process"`, `messaging.destination.name` (the topic),
//! `messaging.destination.partition.id`, `messaging.kafka.offset` (the first message's),
//! `messaging.consumer.group.name`, `messaging.batch.message_count` for a batch, and
//! idem's outcome: `idem.outcome` (a [`Fate`](crate::Fate) name; for a batch, that of its
//! last message routed). Never the payload, nor the Kafka key. idem's own `idem.handle`
//! spans nest inside.

use tracing::Span;

/// The span of handling `count` messages of `topic`/`partition` from `offset`.
pub(crate) fn process_span(
    group: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    count: usize,
) -> Span {
    let span = tracing::info_span!(
        "process",
        otel.name = format!("process {topic}"),
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.destination.name = topic,
        messaging.destination.partition.id = partition,
        messaging.kafka.offset = offset,
        messaging.consumer.group.name = group,
        messaging.batch.message_count = tracing::field::Empty,
        idem.outcome = tracing::field::Empty,
        trace_parent = tracing::field::Empty,
    );
    if count > 1 {
        span.record("messaging.batch.message_count", count);
    }
    span
}

/// Records a message's fate on its span.
pub(crate) fn record_fate(span: &Span, fate: &crate::fate::Fate) {
    span.record("idem.outcome", fate.as_str());
}
