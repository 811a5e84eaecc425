//! The `evervm` crate's `fuzz_targets::server_message` harness under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| evervm::fuzz_targets::server_message(data));
