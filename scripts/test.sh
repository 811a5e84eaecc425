#!/usr/bin/env bash
# Runs every check and test of evervm: formatting, clippy, and the whole test suite.
# This is the command the README gives and the one CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo test"
cargo test --workspace --locked
