//! Each message is handled in a `process <topic>` span after the OpenTelemetry messaging
//! conventions, with idem's outcome on it, and neither the payload nor any of its values.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idem_demo::kafka::producer::{Plan, PlanConfig};
use idem_kafka::OffsetStore;
use sqlx::PgPool;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::support::{Harness, wait_while_progressing};

type Fields = BTreeMap<String, String>;

/// The closed `process` spans of the whole test binary, with their fields.
fn captured() -> &'static Arc<Mutex<Vec<Fields>>> {
    static CAPTURED: OnceLock<Arc<Mutex<Vec<Fields>>>> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Capture(spans.clone()));
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        spans
    })
}

struct Capture(Arc<Mutex<Vec<Fields>>>);

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, context: Context<'_, S>) {
        if attributes.metadata().name() != "process" {
            return;
        }
        let mut fields = Fields::new();
        attributes.record(&mut Visitor(&mut fields));
        if let Some(span) = context.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, context: Context<'_, S>) {
        if let Some(span) = context.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(&mut Visitor(fields));
        }
    }

    fn on_close(&self, id: Id, context: Context<'_, S>) {
        if let Some(span) = context.span(&id)
            && let Some(fields) = span.extensions_mut().remove::<Fields>()
        {
            self.0.lock().unwrap().push(fields);
        }
    }
}

#[sqlx::test(migrations = false)]
async fn each_message_is_a_process_span_with_the_messaging_attributes_and_idem_outcome(
    pool: PgPool,
) {
    let spans = captured();
    let mut harness = Harness::new(&pool, "spans", 1).await;
    harness.log_to_the_global_subscriber();
    let plan = Plan::new(&PlanConfig {
        events: 30,
        duplicate_rate: 0.3,
        malformed: 4,
        seed: 3,
        order_prefix: format!("order-{}", harness.id),
        scatter_duplicates: false,
    });
    let produced = harness.produce(&plan).await.unwrap();
    let member = harness.consumer("c0", OffsetStore::Kafka);
    let stats = member.stats.clone();
    wait_while_progressing(
        Duration::from_secs(60),
        || stats.caught_up(&harness.topic, &produced.end_offsets),
        || stats.snapshot().deliveries,
        || format!("consumed to the end: {:?}", stats.snapshot()),
    )
    .await;
    harness.stop(vec![member]).await;

    let ours: Vec<Fields> = spans
        .lock()
        .unwrap()
        .iter()
        .filter(|fields| fields.get("messaging.destination.name") == Some(&harness.topic))
        .cloned()
        .collect();
    assert!(
        ours.len() >= produced.records,
        "a span per message: {}",
        ours.len()
    );
    let mut outcomes = BTreeMap::<String, usize>::new();
    for fields in &ours {
        assert_eq!(fields["otel.name"], format!("process {}", harness.topic));
        assert_eq!(fields["otel.kind"], "consumer");
        assert_eq!(fields["messaging.system"], "kafka");
        assert_eq!(fields["messaging.operation.type"], "process");
        assert_eq!(fields["messaging.destination.partition.id"], "0");
        assert_eq!(fields["messaging.consumer.group.name"], harness.group);
        assert!(
            fields["messaging.kafka.offset"].parse::<i64>().is_ok(),
            "{fields:?}"
        );
        *outcomes.entry(fields["idem.outcome"].clone()).or_default() += 1;
        // Neither the payload nor the order ids in it.
        let order_ids = format!("order-{}", harness.id);
        assert!(
            fields.values().all(|value| !value.contains(&order_ids)),
            "no payload value on the span: {fields:?}"
        );
    }
    let counted = stats.snapshot();
    assert_eq!(
        outcomes.get("executed").copied(),
        Some(counted.executed as usize),
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.get("duplicate").copied(),
        Some(counted.duplicates as usize),
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.get("dead_letter").copied(),
        Some(4),
        "{outcomes:?}"
    );
    harness.finish().await;
}
