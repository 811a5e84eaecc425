//! End-to-end suites, one test binary. Every suite runs on every backend `backends()` lists.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod client;
mod faults;
mod forever;
mod gvisor;
mod isolation;
mod sdk;
