//! The binary of every scenario application: the variant's library (crate `scenario`)
//! runs it.

fn main() {
    scenario::main();
}
