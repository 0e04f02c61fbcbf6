//! xtask: project automation (placeholder while the foundation lands).
fn main() {}
