#!/usr/bin/env bash
# Builds EvervmFFI.xcframework (macOS arm64 + x86_64, iOS device, iOS simulator arm64 + x86_64)
# from this crate, for Package.swift. Needs a Mac with Xcode and rustup:
#
#   rustup target add aarch64-apple-darwin x86_64-apple-darwin aarch64-apple-ios \
#       aarch64-apple-ios-sim x86_64-apple-ios
#   bindings-swift/scripts/build-xcframework.sh
#
# Not run on the Linux machines evervm is developed on (no Apple SDKs there).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(uname -s)" = Darwin ] || { echo "build-xcframework.sh needs macOS with Xcode" >&2; exit 1; }
target="$(cd .. && pwd)/target"
for t in aarch64-apple-darwin x86_64-apple-darwin aarch64-apple-ios aarch64-apple-ios-sim x86_64-apple-ios; do
    echo "==> $t"
    cargo build --locked --release -p evervm-swift --target "$t"
done
out="$target/xcframework"
rm -rf "$out" EvervmFFI.xcframework
mkdir -p "$out/macos" "$out/ios-sim"
lipo -create "$target/aarch64-apple-darwin/release/libevervm_ffi.a" \
    "$target/x86_64-apple-darwin/release/libevervm_ffi.a" -output "$out/macos/libevervm_ffi.a"
lipo -create "$target/aarch64-apple-ios-sim/release/libevervm_ffi.a" \
    "$target/x86_64-apple-ios/release/libevervm_ffi.a" -output "$out/ios-sim/libevervm_ffi.a"
xcodebuild -create-xcframework \
    -library "$out/macos/libevervm_ffi.a" -headers Sources/EvervmFFI \
    -library "$target/aarch64-apple-ios/release/libevervm_ffi.a" -headers Sources/EvervmFFI \
    -library "$out/ios-sim/libevervm_ffi.a" -headers Sources/EvervmFFI \
    -output EvervmFFI.xcframework
echo "wrote $(pwd)/EvervmFFI.xcframework"
