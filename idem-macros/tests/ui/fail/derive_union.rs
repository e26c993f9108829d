#[derive(idem_runtime::KeyPart)]
union Bits {
    int: u32,
    float: f32,
}

fn main() {}
