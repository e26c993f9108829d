//! The testing kit through the route: a handle built by `testing::idem_with` with the
//! route's pooler setting, `assert_idempotent` with its effects query, and `count_rows`,
//! many times over (a transaction pooler hands successive statements to different server
//! connections, so a statement prepared on one is missing on the next).

use idem_runtime::testing::{self, Effects};
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

use crate::route::{Database, Route};

pub struct Shipment {
    pub order_id: String,
}

#[idempotent(key = "order_id", scope = "kit_ship")]
async fn ship(tx: &mut PgConnection, shipment: &Shipment) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO kit_shipments (order_id) VALUES ($1)")
        .bind(&shipment.order_id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

pub async fn run(route: Route) {
    let database = Database::create(route, "testing_kit").await;
    sqlx::query("CREATE TABLE kit_shipments (order_id text PRIMARY KEY)")
        .execute(&database.direct)
        .await
        .unwrap();
    let pool = route.idem(&database.name, 4).await.pool().clone();
    let idem = testing::idem_with(Idem::builder(pool).pooler(route.pooler())).await;
    let shipments = Effects::query("SELECT count(*) FROM kit_shipments");
    for n in 0..30 {
        let shipment = Shipment {
            order_id: format!("order-{n}"),
        };
        testing::assert_idempotent(&idem, &shipments, || ship(&idem, &shipment)).await;
        assert_eq!(
            testing::count_rows(idem.pool(), "kit_shipments").await,
            n + 1
        );
    }
    database.drop().await;
}
