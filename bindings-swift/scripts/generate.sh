#!/usr/bin/env bash
# Builds the library and writes the Swift sources generated from it (committed, and checked for
# drift in CI): Sources/Evervm/Evervm.swift and Sources/EvervmFFI/ (the C header and module map
# the XCFramework carries). With a directory argument, also writes uniffi's Python bindings
# there with the library beside them (what the tests drive).
#
#   bindings-swift/scripts/generate.sh [PYTHON_OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked -p evervm-swift --features cli
target="$(realpath "${CARGO_TARGET_DIR:-../target}")"
library="$target/debug/libevervm_ffi.so"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The generator reads uniffi.toml through `cargo metadata`: it runs from this crate.
"$target/debug/uniffi-bindgen" generate "$library" --language swift --no-format --out-dir "$work" >/dev/null
mkdir -p Sources/Evervm Sources/EvervmFFI
cp "$work/Evervm.swift" Sources/Evervm/Evervm.swift
cp "$work/EvervmFFI.h" Sources/EvervmFFI/EvervmFFI.h
cp "$work/EvervmFFI.modulemap" Sources/EvervmFFI/module.modulemap
if [ -n "${1:-}" ]; then
    mkdir -p "$1"
    "$target/debug/uniffi-bindgen" generate "$library" --language python --no-format --out-dir "$1" >/dev/null
    cp "$library" "$1/"
fi
