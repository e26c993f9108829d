//! The check a person (or a test) can trust: SQL over the business tables, compared with
//! the facts the producer published.

use std::fmt;

use sqlx::PgPool;

use super::handlers::event_type_name;
use crate::orders::OrderEvent;

/// What the business tables hold, compared with the published facts. Assumes the tables
/// hold only the effects of these facts (a fresh database).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verification {
    /// Business facts published.
    pub facts: i64,
    /// Rows in `order_effects`.
    pub effect_rows: i64,
    /// Facts with exactly their own effect row (same order, type and amount).
    pub applied_facts: i64,
    /// `(order_id, event_type)` pairs with more than one effect row.
    pub applied_twice: i64,
    /// Facts without an effect row.
    pub missing: i64,
    /// Effect rows that match no published fact (a mismatched payload applied, ...).
    pub unexpected: i64,
    /// Orders whose `order_totals` row differs from the sum of their facts.
    pub totals_wrong: i64,
}

impl Verification {
    /// Whether every fact was applied exactly once and nothing else was applied.
    pub fn exactly_once(&self) -> bool {
        self.effect_rows == self.facts
            && self.applied_facts == self.facts
            && self.applied_twice == 0
            && self.missing == 0
            && self.unexpected == 0
            && self.totals_wrong == 0
    }
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} facts, {} effect rows, {} applied twice, {} missing, {} unexpected, {} order totals wrong",
            self.facts,
            self.effect_rows,
            self.applied_twice,
            self.missing,
            self.unexpected,
            self.totals_wrong
        )
    }
}

/// Compares `order_effects` and `order_totals` with `facts`.
pub async fn verify(pool: &PgPool, facts: &[OrderEvent]) -> Result<Verification, sqlx::Error> {
    let order_ids: Vec<&str> = facts.iter().map(|event| event.order_id.as_str()).collect();
    let types: Vec<&str> = facts
        .iter()
        .map(|event| event_type_name(event.event_type))
        .collect();
    let amounts: Vec<i64> = facts.iter().map(|event| event.amount_cents).collect();
    let row: (i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "WITH expected AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS e(order_id, event_type, amount_cents)
        ), applied AS (
            SELECT order_id, event_type, amount_cents, count(*) AS n
            FROM order_effects GROUP BY order_id, event_type, amount_cents
        )
        SELECT
            (SELECT count(*) FROM expected),
            (SELECT count(*) FROM order_effects),
            (SELECT count(*) FROM expected JOIN applied USING (order_id, event_type, amount_cents) WHERE applied.n = 1),
            (SELECT count(*) FROM (
                SELECT 1 FROM order_effects GROUP BY order_id, event_type HAVING count(*) > 1
            ) AS twice),
            (SELECT count(*) FROM expected LEFT JOIN applied USING (order_id, event_type, amount_cents)
             WHERE applied.n IS NULL),
            (SELECT coalesce(sum(applied.n), 0)::bigint FROM applied
             LEFT JOIN expected USING (order_id, event_type, amount_cents) WHERE expected.order_id IS NULL),
            (SELECT count(*) FROM (
                SELECT order_id, count(*) AS events, sum(amount_cents)::bigint AS amount_cents
                FROM expected GROUP BY order_id
            ) AS sums FULL JOIN order_totals AS totals USING (order_id)
             WHERE sums.events IS DISTINCT FROM totals.events
                OR sums.amount_cents IS DISTINCT FROM totals.amount_cents)",
    )
    .bind(&order_ids)
    .bind(&types)
    .bind(&amounts)
    .fetch_one(pool)
    .await?;
    let (facts, effect_rows, applied_facts, applied_twice, missing, unexpected, totals_wrong) = row;
    Ok(Verification {
        facts,
        effect_rows,
        applied_facts,
        applied_twice,
        missing,
        unexpected,
        totals_wrong,
    })
}

/// A dead letter, as the checks compare them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The partition.
    pub kafka_partition: i32,
    /// The offset.
    pub kafka_offset: i64,
    /// The raw payload.
    pub payload: Option<Vec<u8>>,
    /// Why it was set aside.
    pub reason: String,
    /// The error text.
    pub error: String,
}

/// The dead letters of `group` (in the default schema of idem-kafka's tables), by
/// partition and offset, as [`idem_kafka::dead_letters`] reads them.
pub async fn dead_letters(pool: &PgPool, group: &str) -> Result<Vec<DeadLetter>, sqlx::Error> {
    let idem = idem_runtime::Idem::new(pool.clone());
    let schema = idem_kafka::Schema::for_idem(&idem);
    let dead = idem_kafka::dead_letters(&idem, &schema, group).await?;
    Ok(dead
        .into_iter()
        .map(|dead| DeadLetter {
            kafka_partition: dead.partition,
            kafka_offset: dead.offset,
            payload: dead.payload,
            reason: dead.reason.to_string(),
            error: dead.error,
        })
        .collect())
}
