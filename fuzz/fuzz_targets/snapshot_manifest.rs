//! The engine's `fuzz_targets::snapshot_manifest` harness under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| evervm_engine::fuzz_targets::snapshot_manifest(data));
