//! The dead letters read back with their reason, also one that a later release wrote and
//! this one does not know: such a row reads as `Unrecoverable` with the reason as stored,
//! and does not make the group's other dead letters unreadable. A later release can then
//! give a dead letter a reason of its own while this one runs beside it.

use idem_demo::kafka;
use idem_kafka::{Reason, Schema};
use idem_runtime::Idem;
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn a_reason_of_a_later_release_reads_as_unrecoverable_and_keeps_its_text(pool: PgPool) {
    let idem = Idem::new(pool.clone());
    kafka::prepare(&idem).await.unwrap();
    let schema = Schema::for_idem(&idem);
    for (offset, reason) in [(1_i64, "parked"), (2, "outside_window"), (3, "missing_key")] {
        sqlx::query(&format!(
            "INSERT INTO {}.kafka_dead_letters \
             (consumer_group, topic, kafka_partition, kafka_offset, payload, reason, error) \
             VALUES ('g', 't', 0, $1, '\\x00ff'::bytea, $2, 'an error')",
            schema.as_str()
        ))
        .bind(offset)
        .bind(reason)
        .execute(&pool)
        .await
        .unwrap();
    }

    let dead = idem_kafka::dead_letters(&idem, &schema, "g").await.unwrap();
    let read: Vec<(i64, Reason, &str)> = dead
        .iter()
        .map(|dead| (dead.offset, dead.reason, dead.stored_reason.as_str()))
        .collect();
    assert_eq!(
        read,
        [
            (1, Reason::Parked, "parked"),
            (2, Reason::Unrecoverable, "outside_window"),
            (3, Reason::MissingKey, "missing_key"),
        ]
    );
    assert_eq!(dead[1].payload.as_deref(), Some(&[0x00, 0xff][..]));
}
