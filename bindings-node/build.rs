//! Link settings for a Node-API module (macOS lets the symbols resolve at load time).

fn main() {
    napi_build::setup();
}
