#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-fuzz, libFuzzer, nightly) of every decoder that reads bytes
# from a hostile guest, client or server: the agent channel, the snapshot manifest, WebSocket
# messages both ways, request bodies and path names, NDJSON result streams and server answers.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Runs each named target (all of `fuzz/Cargo.toml` when none is named) for SECONDS (default 60)
# and prints a table of executions per target. Each run starts from the committed seeds in
# fuzz/seeds/TARGET/ plus the local corpus in fuzz/corpus/TARGET/ (what earlier runs found; not
# committed). The harnesses themselves are the `fuzz_targets` modules of engine/ and core/.
#
# A crash stops its target, leaves the input in fuzz/artifacts/TARGET/ and makes this script
# exit non-zero. Then: fix the bug, add a unit test beside the code, and copy the input into
# fuzz/seeds/TARGET/, where `cargo test` replays it on stable (that replay is what CI runs; CI
# never runs this script).
#
# Needs the nightly toolchain (rustup) and installs cargo-fuzz from crates.io when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

seconds="${1:-60}"
shift || true
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: the nightly toolchain is missing: rustup toolchain install nightly" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo +nightly install cargo-fuzz --locked
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

# Debug assertions and overflow checks on: an overflow is a bug worth a crash report.
build=(--debug-assertions)
echo "==> building the fuzz targets"
cargo +nightly fuzz build "${build[@]}"

summary=()
status=0
for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
    log="fuzz/artifacts/$target/last-run.log"
    echo "==> $target for ${seconds} s"
    start=$(date +%s)
    result=ok
    # -timeout: an input that takes over 10 s is a hang; -rss_limit_mb: a leak or an unbounded
    # buffer is a crash.
    if ! cargo +nightly fuzz run "${build[@]}" "$target" "fuzz/corpus/$target" \
        "fuzz/seeds/$target" -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1; then
        result=CRASH
        status=1
        tail -n 40 "$log"
    fi
    elapsed=$(($(date +%s) - start))
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    corpus=$(find "fuzz/corpus/$target" -type f | wc -l)
    summary+=("$(printf '%-20s %12s %10s %8s %8s  %s' "$target" "${executions:-?}" \
        "${rate:-?}" "${elapsed}s" "$corpus" "$result")")
done

printf '\n%-20s %12s %10s %8s %8s  %s\n' target executions exec/s time corpus result
printf '%s\n' "${summary[@]}"
exit "$status"
