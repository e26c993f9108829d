//! Each handling counts its outcome in `idem_handlings_total` (labels scope, mode,
//! outcome), times its claim and body, and runs in an `idem.handle` span that carries the
//! scope, the key, the mode, the outcome and the attempts: executed, duplicate, failed and
//! parked handlings, read back from a recorder and a subscriber installed by the test.
mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use idem_runtime::{Idem, idempotent};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use sqlx::{PgConnection, PgPool};
use support::orders::OrderEvent;
use support::testing;
use tracing_subscriber::fmt::format::FmtSpan;

#[derive(Debug, thiserror::Error)]
#[error("declined")]
struct Declined;

#[idempotent(
    key = "order_id",
    scope = "metered",
    shared_scope = true,
    max_attempts = 2
)]
async fn meter(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), Declined> {
    if event.amount_cents < 0 {
        return Err(Declined);
    }
    testing::insert_effect(tx, event)
        .await
        .map(drop)
        .map_err(|_| Declined)
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn labels(key: &CompositeKey) -> Vec<(String, String)> {
    key.key()
        .labels()
        .map(|label| (label.key().to_owned(), label.value().to_owned()))
        .collect()
}

// Keyed on the producer's stamp: a message without one has no key.
#[idempotent(key = "event_key", scope = "metered", shared_scope = true)]
async fn meter_stamped(tx: &mut PgConnection, event: &OrderEvent) -> Result<(), Declined> {
    let _ = (tx, event);
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn outcomes_are_counted_and_spans_carry_them(pool: PgPool) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_span_events(FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let idem: Idem = testing::setup(&pool).await;
    let event = testing::paid("o-metered", 10);
    let declined = testing::paid("o-declined", -1);
    meter(&idem, &event).await.unwrap(); // executed
    meter(&idem, &event).await.unwrap(); // duplicate
    meter(&idem, &declined).await.unwrap_err(); // failed
    meter(&idem, &declined).await.unwrap_err(); // failed, parks the key
    meter(&idem, &declined).await.unwrap_err(); // parked
    meter_stamped(&idem, &event).await.unwrap_err(); // no key: `event_key` is None

    let mut outcomes = Vec::new();
    let mut histograms = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels = labels(&key);
        if !labels.contains(&("scope".to_owned(), "metered".to_owned())) {
            continue;
        }
        match (key.kind(), key.key().name(), value) {
            (MetricKind::Counter, "idem_handlings_total", DebugValue::Counter(n)) => {
                let outcome = labels
                    .iter()
                    .find(|(k, _)| k == "outcome")
                    .unwrap()
                    .1
                    .clone();
                assert!(labels.contains(&("mode".to_owned(), "transaction".to_owned())));
                outcomes.push((outcome, n));
            }
            (MetricKind::Histogram, name, DebugValue::Histogram(values)) => {
                histograms.push((name.to_owned(), values.len()));
            }
            _ => {}
        }
    }
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            ("duplicate".to_owned(), 1),
            ("executed".to_owned(), 1),
            ("failed".to_owned(), 1),
            ("key_error".to_owned(), 1),
            ("parked".to_owned(), 2),
        ]
    );
    histograms.sort();
    // Four claims (the parked key is decided by its claim, too: five) and three bodies.
    assert_eq!(
        histograms,
        [
            ("idem_claim_duration_seconds".to_owned(), 5),
            ("idem_handler_duration_seconds".to_owned(), 3),
        ]
    );

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let spans: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("idem.handle"))
        .collect();
    assert_eq!(spans.len(), 5, "{logs}");
    for (span, outcome) in spans
        .iter()
        .zip(["executed", "duplicate", "failed", "parked", "parked"])
    {
        assert!(
            span.contains("idem.scope=\"metered\"") || span.contains("idem.scope=metered"),
            "{span}"
        );
        assert!(
            span.contains("idem.mode=\"transaction\"") || span.contains("idem.mode=transaction"),
            "{span}"
        );
        assert!(
            span.contains(&format!("idem.outcome=\"{outcome}\""))
                || span.contains(&format!("idem.outcome={outcome}")),
            "{span}"
        );
        assert!(span.contains("idem.key="), "{span}");
        assert!(
            !span.contains("o-metered") && !span.contains("o-declined"),
            "no payload in spans: {span}"
        );
    }
    assert!(spans[3].contains("idem.attempts=2"), "{}", spans[3]);
}
