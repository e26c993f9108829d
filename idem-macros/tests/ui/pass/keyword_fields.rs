//! A field named with a keyword (`type`, common in events) can be keyed, written `type`
//! or `r#type`, in the string and in the identifier form.
use idem_runtime::{Idem, idempotent};
use sqlx::PgConnection;

struct Event {
    id: String,
    r#type: String,
    r#ref: Option<u64>,
}

#[idempotent(key = "id, type", fingerprint = "ref")]
async fn plain(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = (tx, &event.id, &event.r#type);
    Ok(())
}

#[idempotent(key = "id, r#type", fingerprint = "r#ref")]
async fn raw(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

#[idempotent(key(id, type), fingerprint(r#ref))]
async fn identifiers(tx: &mut PgConnection, event: &Event) -> Result<(), sqlx::Error> {
    let _ = tx;
    Ok(())
}

async fn deliver(idem: &Idem, event: &Event) {
    let _ = plain(idem, event).await;
    let _ = raw(idem, event).await;
    let _ = identifiers(idem, event).await;
}

fn main() {
    let _ = deliver;
}
