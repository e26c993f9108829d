//! Two hops through the outbox across the failover: the order events are applied by a
//! first handler that writes a row and sends two records (a receipt and a stock
//! reservation) through idem-kafka's outbox in its transaction; a relay publishes them to
//! a second topic; a second handler, keyed on each record's `idem-key`, writes a row per
//! record. Both handlers store their positions in PostgreSQL in the transaction of their
//! effects (`Position::store`), in one database of the cluster.

use idem_demo::kafka::handlers::event_type_name;
use idem_demo::orders::OrderEvent;
use idem_kafka::outbox::{self, Record};
use idem_kafka::{Fate, Handler, Keyed, Position, Received};
use idem_runtime::{Idem, idempotent};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

/// The chain's tables, in its database.
pub const CREATE_TABLES: &str = "
    CREATE TABLE chain_applied (order_id text NOT NULL, event_type text NOT NULL);
    CREATE TABLE chain_received (idem_key uuid NOT NULL, order_id text NOT NULL,
                                 event_type text NOT NULL, kind text NOT NULL);";

/// A record of the second topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outgoing {
    order_id: String,
    event_type: String,
    kind: String,
}

/// Hop 1: the event's row, its receipt and stock records for `topic_b`, keyed by order,
/// and the consumer's position, in the claim's transaction.
#[idempotent(key = "event_key", scope = "failover.apply_event")]
async fn apply_event(
    tx: &mut PgConnection,
    event: &OrderEvent,
    topic_b: &str,
    position: &Position,
) -> Result<(), sqlx::Error> {
    let event_type = event_type_name(event.event_type);
    sqlx::query("INSERT INTO chain_applied (order_id, event_type) VALUES ($1, $2)")
        .bind(&event.order_id)
        .bind(event_type)
        .execute(&mut *tx)
        .await?;
    let record = |kind: &str| {
        let out = Outgoing {
            order_id: event.order_id.clone(),
            event_type: event_type.to_owned(),
            kind: kind.to_owned(),
        };
        Record::to(topic_b)
            .name(kind)
            .key(&event.order_id)
            .json(&out)
    };
    outbox::send_all(tx, [record("receipt")?, record("stock")?]).await?;
    position.store(tx).await
}

/// Hop 2: one row per outgoing record, however often it arrives, and the consumer's
/// position, in the claim's transaction.
#[idempotent(key = "idem_key", scope = "failover.receive")]
async fn receive(
    tx: &mut PgConnection,
    out: &Keyed<Outgoing>,
    position: &Position,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO chain_received (idem_key, order_id, event_type, kind) VALUES ($1, $2, $3, $4)",
    )
    .bind(out.idem_key)
    .bind(&out.message.order_id)
    .bind(&out.message.event_type)
    .bind(&out.message.kind)
    .execute(&mut *tx)
    .await?;
    position.store(tx).await
}

/// The first hop's handler: order events, sending to `topic_b`.
#[derive(Clone)]
pub struct Events {
    /// The second topic.
    pub topic_b: String,
}

impl Handler for Events {
    type Message = OrderEvent;
    fn decode(&self, payload: &[u8]) -> Result<OrderEvent, String> {
        idem_kafka::decode_json(payload)
    }
    async fn handle(&self, idem: &Idem, event: &OrderEvent, position: Option<&Position>) -> Fate {
        let position = position.expect("offsets in PostgreSQL: the consumer hands a position");
        Fate::of(apply_event(idem, event, &self.topic_b, position).await)
    }
    // The position is written with the effects: a primary that lost the effects lost the
    // position too, and the member reads again from there.
    fn stores_position(&self) -> bool {
        true
    }
}

/// The second hop's handler: the records, keyed on their `idem-key` header.
#[derive(Clone)]
pub struct Records;

impl Handler for Records {
    type Message = Keyed<Outgoing>;
    fn decode(&self, _: &[u8]) -> Result<Keyed<Outgoing>, String> {
        Err("decoded with its headers".to_owned())
    }
    fn decode_received(&self, received: &Received<'_>) -> Result<Keyed<Outgoing>, String> {
        Keyed::decode_json(received)
    }
    async fn handle(
        &self,
        idem: &Idem,
        out: &Keyed<Outgoing>,
        position: Option<&Position>,
    ) -> Fate {
        let position = position.expect("offsets in PostgreSQL: the consumer hands a position");
        Fate::of(receive(idem, out, position).await)
    }
    fn stores_position(&self) -> bool {
        true
    }
}

/// What the chain's database holds at the end, against the published facts.
#[derive(Debug, Default)]
pub struct ChainOutcome {
    /// Facts without a row of hop 1.
    pub lost_first: i64,
    /// Facts with more than one row of hop 1.
    pub doubled_first: i64,
    /// Facts missing one of their two records' rows at hop 2.
    pub lost_second: i64,
    /// Records with more than one row at hop 2.
    pub doubled_second: i64,
    /// Rows of hop 2 whose fact has no row of hop 1.
    pub orphans: i64,
    /// Outbox records not sent, or parked.
    pub unsent: i64,
}

/// Counts, by SQL, what the chain applied of `facts`.
pub async fn outcome(pool: &PgPool, facts: &[OrderEvent]) -> ChainOutcome {
    let order_ids: Vec<&str> = facts.iter().map(|event| event.order_id.as_str()).collect();
    let types: Vec<&str> = facts
        .iter()
        .map(|event| event_type_name(event.event_type))
        .collect();
    let (lost_first, doubled_first, lost_second, doubled_second, orphans, unsent): (
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    ) = sqlx::query_as(
        "WITH expected AS (
            SELECT * FROM unnest($1::text[], $2::text[]) AS e(order_id, event_type)
        ), first AS (
            SELECT order_id, event_type, count(*) AS n FROM chain_applied GROUP BY 1, 2
        ), second AS (
            SELECT order_id, event_type, kind, count(*) AS n FROM chain_received GROUP BY 1, 2, 3
        )
        SELECT
            (SELECT count(*) FROM expected LEFT JOIN first USING (order_id, event_type)
             WHERE first.n IS NULL),
            (SELECT count(*) FROM first WHERE n > 1),
            (SELECT count(*) FROM expected e WHERE
                (SELECT count(DISTINCT kind) FROM second s
                 WHERE s.order_id = e.order_id AND s.event_type = e.event_type) < 2),
            (SELECT count(*) FROM second WHERE n > 1),
            (SELECT count(*) FROM second LEFT JOIN first USING (order_id, event_type)
             WHERE first.n IS NULL),
            (SELECT count(*) FROM idem_kafka.kafka_outbox
             WHERE sent_at IS NULL OR parked_at IS NOT NULL)",
    )
    .bind(&order_ids)
    .bind(&types)
    .fetch_one(pool)
    .await
    .unwrap();
    ChainOutcome {
        lost_first,
        doubled_first,
        lost_second,
        doubled_second,
        orphans,
        unsent,
    }
}

/// Outbox records not yet sent (parked ones included); `None` when the database does not
/// answer (the failover).
pub async fn unsent(pool: &PgPool) -> Option<i64> {
    sqlx::query_scalar("SELECT count(*) FROM idem_kafka.kafka_outbox WHERE sent_at IS NULL")
        .fetch_one(pool)
        .await
        .ok()
}
