//! What the benchmark and load programs share: percentiles of latency samples and memory
//! readings from `/proc`.

pub mod measure;
