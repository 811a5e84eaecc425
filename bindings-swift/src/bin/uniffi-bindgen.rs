//! uniffi's bindings generator, at the version this crate is built with.

fn main() {
    uniffi::uniffi_bindgen_main();
}
