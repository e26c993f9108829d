//! The operator's API through the route: a parked key listed, retried and run again; the
//! stats, the migrations' state, a key's record, the retention cleanup, a scope released.

use std::time::Duration;

use idem_runtime::Status;
use idem_runtime::admin::{self, KeyFilter};
use idem_runtime::key::KeyBuilder;
use idem_runtime::retention::Retention;
use idem_runtime::{Outcome, idempotent};
use sqlx::PgConnection;

use crate::route::{Database, Route};

pub struct Order {
    pub order_id: String,
    pub declined: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("card declined")]
pub struct Declined;

#[idempotent(key = "order_id", scope = "operator_pay", max_attempts = 1)]
async fn pay(_tx: &mut PgConnection, order: &Order) -> Result<String, Declined> {
    if order.declined {
        return Err(Declined);
    }
    Ok(format!("paid {}", order.order_id))
}

pub async fn run(route: Route) {
    let database = Database::create(route, "operator").await;
    let idem = route.idem(&database.name, 4).await;
    idem.migrate().await.unwrap();
    assert!(
        admin::migration_status(&idem)
            .await
            .unwrap()
            .iter()
            .all(|m| m.applied)
    );
    admin::ensure_migrated(&idem).await.unwrap();

    let declined = Order {
        order_id: "o-1".into(),
        declined: true,
    };
    let parked = pay(&idem, &declined).await;
    assert!(
        matches!(
            parked,
            Err(idem_runtime::Error::Handler { parked: true, .. })
        ),
        "{parked:?}"
    );
    for n in 2..=20 {
        let order = Order {
            order_id: format!("o-{n}"),
            declined: false,
        };
        assert!(pay(&idem, &order).await.unwrap().is_executed());
    }
    let key = KeyBuilder::new().part("order_id", "o-1").unwrap().finish();
    let record = idem.record("operator_pay", key).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Parked);

    let parked_filter = KeyFilter::new().status(Status::Parked);
    let listed = admin::list_keys(&idem, &parked_filter, None, 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].last_error.as_deref(), Some("card declined"));
    let shown = admin::show_key(&idem, "operator_pay", key.as_uuid())
        .await
        .unwrap();
    assert_eq!(shown.status, "parked");
    let retried = admin::retry_keys(&idem, &parked_filter, false)
        .await
        .unwrap();
    assert_eq!(retried.keys.len(), 1);
    let paid = pay(
        &idem,
        &Order {
            order_id: "o-1".into(),
            declined: false,
        },
    )
    .await;
    assert!(matches!(paid, Ok(Outcome::Executed(_))), "{paid:?}");

    let stats = admin::stats(&idem).await.unwrap();
    let success: i64 = stats
        .counts
        .iter()
        .filter(|c| c.status == "success")
        .map(|c| c.count)
        .sum();
    assert_eq!(success, 20);
    assert!(stats.table_bytes > 0);

    let done = idem
        .done_keys(
            &mut idem.pool().acquire().await.unwrap(),
            "operator_pay",
            &[(key, None)],
        )
        .await
        .unwrap();
    assert_eq!(done, vec![true]);

    // Retention: every success key is past a window of one millisecond.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let everything = Retention::new(Duration::from_millis(1));
    let counted = idem.purge_dry_run(&everything).await.unwrap();
    assert_eq!(counted.deleted, 20);
    let purged = idem.purge_with(&everything).await.unwrap();
    assert!(!purged.locked_out);
    assert_eq!(purged.deleted, 20);
    assert_eq!(
        database.count("SELECT count(*) FROM idem.idem_keys").await,
        0
    );
    // Nothing of the cleanup stays in a session: a second cleanup is not locked out.
    assert!(!idem.purge_with(&everything).await.unwrap().locked_out);

    assert!(idem.release_scope("operator_pay").await.unwrap());
    database.drop().await;
}
