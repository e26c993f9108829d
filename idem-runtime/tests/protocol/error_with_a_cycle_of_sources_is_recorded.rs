//! A handler's error whose `source()` leads back to itself (a cycle, which the standard
//! library does not forbid) is recorded like any other failure, with a bounded text, and
//! parks the key after `max_attempts`: the delivery returns instead of formatting the
//! chain forever.
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::support::testing;
use idem_runtime::Status;
use idem_runtime::{Disposition, Error, idempotent};
use sqlx::{PgConnection, PgPool};

#[derive(Debug)]
struct Looping;

impl fmt::Display for Looping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("looping upstream")
    }
}

impl StdError for Looping {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&Looping)
    }
}

struct Order {
    order_id: String,
}

#[idempotent(key = "order_id", scope = "looping", max_attempts = 2)]
async fn fail_with_a_cycle(tx: &mut PgConnection, order: &Order) -> Result<(), Looping> {
    let _ = (tx, &order.order_id);
    Err(Looping)
}

#[sqlx::test(migrations = false)]
async fn error_with_a_cycle_of_sources_is_recorded_and_parks(pool: PgPool) {
    let idem = testing::setup(&pool).await;
    let order = Order {
        order_id: "o-loop".to_owned(),
    };
    for attempt in 1..=2 {
        let delivery =
            tokio::time::timeout(Duration::from_secs(30), fail_with_a_cycle(&idem, &order));
        let error = delivery.await.expect("the delivery returns").unwrap_err();
        assert!(
            matches!(error, Error::Handler { attempts, .. } if attempts == attempt),
            "{error:?}"
        );
        let expected = if attempt == 2 {
            Disposition::DeadLetter
        } else {
            Disposition::Retry
        };
        assert_eq!(error.disposition(), expected);
    }
    let key = fail_with_a_cycle_key(&order).unwrap();
    let record = idem
        .record(key.scope(), key.key())
        .await
        .unwrap()
        .expect("the key is recorded");
    assert_eq!(record.status, Status::Parked);
    let text = record.last_error.expect("the failure's text");
    assert!(text.starts_with("looping upstream"), "{text}");
    assert!(text.len() <= 2048, "{}", text.len());
}
