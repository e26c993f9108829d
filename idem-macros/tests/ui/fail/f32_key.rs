use idem_runtime::idempotent;
use sqlx::PgConnection;

struct Reading {
    sensor: u32,
    value: f32,
}

#[idempotent(key = "sensor, value")]
async fn record(tx: &mut PgConnection, reading: &Reading) -> Result<(), sqlx::Error> {
    let _ = (tx, reading.sensor);
    Ok(())
}

fn main() {}
