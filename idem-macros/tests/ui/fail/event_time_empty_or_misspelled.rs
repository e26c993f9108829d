use chrono::{DateTime, Utc};
use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Fact {
    id: String,
    at: DateTime<Utc>,
}

// `event_time` names one key field: an empty one is told so, with an example of one field.
#[idempotent(key = "id, at", event_time = "")]
async fn empty(tx: &mut PgConnection, fact: &Fact) -> Result<(), sqlx::Error> {
    let _ = (tx, &fact.id, fact.at);
    Ok(())
}

// The identifier form too.
#[idempotent(key(id, at), event_time())]
async fn empty_identifiers(tx: &mut PgConnection, fact: &Fact) -> Result<(), sqlx::Error> {
    let _ = (tx, &fact.id, fact.at);
    Ok(())
}

// A misspelled field: said to be none of the key's, with the one it was probably meant as.
#[idempotent(key = "id, at", event_time = "atx")]
async fn misspelled(tx: &mut PgConnection, fact: &Fact) -> Result<(), sqlx::Error> {
    let _ = (tx, &fact.id, fact.at);
    Ok(())
}

fn main() {}
