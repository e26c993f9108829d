use idem_runtime::idempotent;

struct OrderEvent {
    order_id: String,
}

// Every problem is reported at once, not one per compilation.
#[idempotent(key = "order_id,, order id", max_attempts = 0, retries = 3)]
fn apply(tx: &String, event: &OrderEvent) -> i64 {
    let _ = (tx, &event.order_id);
    1
}

// The function is still emitted: its callers do not get a second error.
fn caller(tx: &String, event: &OrderEvent) -> i64 {
    apply(tx, event)
}

fn main() {
    let _ = caller;
}
