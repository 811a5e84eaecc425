//! No code: see this crate's `Cargo.toml`.
