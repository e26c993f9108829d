//! A savepoint that a handler's body rolls back takes back the records it sent since, as
//! it takes back the body's other writes: the commit writes only the records that are
//! still part of the transaction. An unnamed record's position counts only those, so
//! that the key of a part sent again after a rollback is the key its first try had; a
//! key sent twice by one run of the body is refused.

use idem_kafka::outbox::{self, OutboxError, Record};
use idem_runtime::{CurrentDelivery, idempotent};
use sqlx::{PgConnection, PgPool};

use crate::support::Harness;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Fact {
    fact_id: String,
}

/// Sends `kept`; in a savepoint that it rolls back, `dropped` and an unnamed record; then
/// an unnamed record and `dropped` again. Returns the keys it was given, by what they are.
#[idempotent(key = "fact_id", scope = "savepoints.send", store_result = false)]
async fn send_around_a_savepoint(
    tx: &mut PgConnection,
    fact: &Fact,
    topic: &str,
) -> Result<Vec<(String, uuid::Uuid)>, sqlx::Error> {
    let record = |name: Option<&str>| {
        let record = Record::to(topic)
            .key("k")
            .payload(name.unwrap_or("unnamed"));
        match name {
            Some(name) => record.name(name),
            None => record,
        }
    };
    let mut keys = vec![(
        "kept".to_owned(),
        outbox::send(tx, record(Some("kept"))).await?,
    )];
    sqlx::query("SAVEPOINT part").execute(&mut *tx).await?;
    keys.push((
        "dropped, rolled back".to_owned(),
        outbox::send(tx, record(Some("dropped"))).await?,
    ));
    keys.push((
        "unnamed, rolled back".to_owned(),
        outbox::send(tx, record(None)).await?,
    ));
    sqlx::query("ROLLBACK TO SAVEPOINT part")
        .execute(&mut *tx)
        .await?;
    keys.push(("unnamed".to_owned(), outbox::send(tx, record(None)).await?));
    keys.push((
        "dropped".to_owned(),
        outbox::send(tx, record(Some("dropped"))).await?,
    ));
    Ok(keys)
}

/// Sends two records of one name.
#[idempotent(key = "fact_id", scope = "savepoints.twice")]
async fn send_one_name_twice(
    tx: &mut PgConnection,
    fact: &Fact,
    topic: &str,
) -> Result<(), sqlx::Error> {
    outbox::send(tx, Record::to(topic).name("receipt").payload("1")).await?;
    let again = outbox::send(tx, Record::to(topic).name("receipt").payload("2")).await;
    match again {
        Err(OutboxError::Invalid(why)) if why.contains("named \"receipt\"") => Ok(()),
        other => panic!("a name sent twice was not refused: {other:?}"),
    }
}

#[sqlx::test(migrations = false)]
async fn a_rolled_back_savepoint_takes_its_records_back(pool: PgPool) {
    let harness = Harness::new(&pool, "outbox-savepoint", 1).await;
    let idem = &harness.idem;
    let fact = Fact {
        fact_id: "f-1".to_owned(),
    };
    let keys = match send_around_a_savepoint(idem, &fact, &harness.topic)
        .await
        .unwrap()
    {
        idem_runtime::Outcome::Executed(keys) => keys,
        other => panic!("{other:?}"),
    };
    let key = |what: &str| keys.iter().find(|(name, _)| name == what).unwrap().1;
    // The part sent again after the rollback has its first try's keys.
    assert_eq!(key("dropped"), key("dropped, rolled back"));
    assert_eq!(key("unnamed"), key("unnamed, rolled back"));

    let written: Vec<(uuid::Uuid, Vec<u8>)> =
        sqlx::query_as("SELECT idem_key, payload FROM idem_kafka.kafka_outbox ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        written,
        vec![
            (key("kept"), b"kept".to_vec()),
            (key("unnamed"), b"unnamed".to_vec()),
            (key("dropped"), b"dropped".to_vec()),
        ],
        "the records of the transaction, in the order they were sent"
    );
    // The keys are the documented ones: the unnamed record is the first of its message.
    let fact_key = idem_runtime::key::key_of(&[&"f-1"]).unwrap();
    let derived = |name: &str| {
        idem_runtime::key::key_of(&[
            &"idem:outgoing",
            &"savepoints.send",
            &fact_key.as_uuid(),
            &name,
        ])
        .unwrap()
        .as_uuid()
    };
    assert_eq!(key("kept"), derived("kept"));
    assert_eq!(key("unnamed"), derived("#0"));
    assert!(CurrentDelivery::get().is_none());

    // A name sent twice by one run is refused, and the body goes on.
    send_one_name_twice(
        idem,
        &Fact {
            fact_id: "f-2".to_owned(),
        },
        &harness.topic,
    )
    .await
    .unwrap();
    let receipts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_kafka.kafka_outbox WHERE payload IN ('\\x31', '\\x32')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(receipts, 1, "the first record of the name only");
    harness.finish().await;
}
