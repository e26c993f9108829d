#[derive(idem_runtime::KeyPart)]
struct Price {
    currency: String,
    amount: f64,
}

#[derive(idem_runtime::KeyPart)]
enum Measure {
    Count(u32),
    Weight(f64),
}

fn main() {}
