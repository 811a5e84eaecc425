//! What the benchmark and load programs share: percentiles of latency samples and memory
//! readings from `/proc`; and the benchmark's snapshot figures.

pub mod measure;
pub mod snapshots;
