//! The engine's `fuzz_targets::agent_channel` harness under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| evervm_engine::fuzz_targets::agent_channel(data));
