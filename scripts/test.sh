#!/usr/bin/env bash
# Runs every check and test of evervm: formatting, clippy, and the whole test suite.
# This is the command the README gives and the one CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

# The end-to-end tests keep machines' snapshots on disk: say how much room there is, so that a
# test refused for want of disk reads as that.
echo "==> free disk: $(df -h --output=avail "${TMPDIR:-/tmp}" | tail -1 | tr -d ' ') in ${TMPDIR:-/tmp}, $(df -h --output=avail . | tail -1 | tr -d ' ') here"
# One build from scratch: incremental state would only double what the build keeps on disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# Root filesystem images are shared by every test engine (and kept between runs); one ready
# sandbox per engine is enough for the tests.
export EVERVM_IMAGES="${EVERVM_IMAGES:-$HOME/.cache/evervm/images}"
export EVERVM_POOL_SIZE="${EVERVM_POOL_SIZE:-1}"
echo "==> building the root filesystem images"
cargo build --locked -p evervm-cli
evervm_bin="$(realpath "${CARGO_TARGET_DIR:-target}")/debug/evervm"
"$evervm_bin" image build --profile minimal
"$evervm_bin" image build --profile data
echo "==> a PostgreSQL server for the PostgreSQL store's tests (Debian's, on loopback)"
pg_dir="${TMPDIR:-/tmp}/evervm-test-postgres"
EVERVM_TEST_POSTGRES="$(scripts/postgres.sh start "$pg_dir" "${EVERVM_TEST_POSTGRES_PORT:-55432}")"
export EVERVM_TEST_POSTGRES
s3_dir="${TMPDIR:-/tmp}/evervm-test-s3"
trap 'scripts/postgres.sh stop "$pg_dir" || true; scripts/seaweedfs.sh stop "$s3_dir" || true' EXIT
echo "==> an S3-compatible server for the snapshot bucket's tests (SeaweedFS, on loopback)"
# The standard AWS environment reaches it, as it would reach any bucket.
AWS_ENDPOINT_URL="$(scripts/seaweedfs.sh start "$s3_dir" "${EVERVM_TEST_S3_PORT:-58333}" evervm-test)"
export AWS_ENDPOINT_URL AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=evervm-test
export AWS_SECRET_ACCESS_KEY=evervm-test-secret EVERVM_TEST_S3=s3://evervm-test
echo "==> cargo test"
# The Python and Node extension modules link against the runtime that loads them: they are
# tested from Python and Node below.
cargo test --workspace --locked --exclude evervm-python --exclude evervm-node --exclude evervm-swift
echo "==> the build takes $(du -sh "${CARGO_TARGET_DIR:-target}" | cut -f1) on disk; $(df -h --output=avail . | tail -1 | tr -d ' ') free"
echo "==> the end-to-end suites on gVisor again, on Debian's runsc (older hosts and old snapshots use it)"
if [ -x /usr/bin/runsc ]; then
    EVERVM_RUNSC=/usr/bin/runsc EVERVM_TEST_BACKENDS=gvisor \
        cargo test --locked -p evervm-tests --test e2e
else
    echo "skipping: Debian's runsc is not installed"
fi
echo "==> load program, small: fails on any error or order violation, never on timing"
# gVisor where it works (swaps included), else the process backend; --max-seconds only stops a
# hang (the run takes about a minute on gVisor, seconds on the process backend).
cargo run --locked -q -p evervm-examples --bin load -- --backend auto --clients 8 \
    --instructions 50 --machines 4 --swap-every-ms 250 --max-seconds 300
echo "==> Python package: pip install ./bindings-python, then its tests"
pyenv_dir="${EVERVM_PYENV:-$HOME/.cache/evervm/pyenv}"
[ -x "$pyenv_dir/bin/python" ] || python3 -m venv "$pyenv_dir"
"$pyenv_dir/bin/pip" install -q --disable-pip-version-check "./bindings-python[test,langchain]"
EVERVM_BIN="$evervm_bin" "$pyenv_dir/bin/python" -m pytest -q -p no:cacheprovider \
    bindings-python/tests
echo "==> Swift package: its Swift sources as generated from the library (the committed ones must match), its FFI surface through uniffi's Python bindings, every Swift file parsed"
# Remote only: the engine itself (sandboxes, the store, SQLite) must stay out of its build.
swift_deps="$(cargo tree --locked -p evervm-swift -e normal --prefix none)"
if grep -E '^(rusqlite|zstd|prometheus-client|libsqlite3-sys) ' <<<"$swift_deps"; then
    echo "the Swift package depends on the engine's runtime (above): keep evervm-engine's runtime feature off" >&2
    exit 1
fi
ffi_dir="$(mktemp -d)"
bindings-swift/scripts/generate.sh "$ffi_dir"
if ! git diff --exit-code -- bindings-swift/Sources; then
    echo "bindings-swift/Sources differ from what scripts/generate.sh writes: commit them" >&2
    exit 1
fi
# No Swift compiler here: the Swift files are parsed (tree-sitter's Swift grammar) instead.
"$pyenv_dir/bin/pip" install -q --disable-pip-version-check "tree-sitter==0.26.1" \
    "tree-sitter-swift==0.7.4"
EVERVM_FFI_DIR="$ffi_dir" EVERVM_BIN="$evervm_bin" "$pyenv_dir/bin/python" -m pytest -q \
    -p no:cacheprovider bindings-swift/tests
rm -rf "$ffi_dir"
echo "==> MCP server: the official MCP Python SDK over stdio and streamable HTTP (gVisor)"
"$pyenv_dir/bin/pip" install -q --disable-pip-version-check "mcp==2.3.0"
EVERVM_BIN="$evervm_bin" "$pyenv_dir/bin/python" -m pytest -q -p no:cacheprovider tests/mcp/test_mcp.py
echo "==> E2B's Python SDK, unmodified, against --e2b-listen (gVisor): sync and async, the newest releases and the oldest that honour E2B_SANDBOX_URL; LangChain's E2B backend on the newest"
for sdk in "newest:e2b-code-interpreter==2.11.5 e2b==2.63.0" "oldest:e2b-code-interpreter==2.9.0 e2b==2.26.0"; do
    e2b_env="$HOME/.cache/evervm/e2b-${sdk%%:*}"
    [ -x "$e2b_env/bin/python" ] || python3 -m venv "$e2b_env"
    # shellcheck disable=SC2086 # the pins are words
    "$e2b_env/bin/pip" install -q --disable-pip-version-check ${sdk#*:} "pytest==8.4.2"
    e2b_tests=(tests/e2b/test_e2b_sdk.py)
    if [ "${sdk%%:*}" = newest ]; then
        # An agent framework's E2B tool, unchanged, on the newest SDK: LangChain's Deep Agents
        # with E2B's langchain-e2b backend, one agent step with a scripted model.
        "$e2b_env/bin/pip" install -q --disable-pip-version-check \
            -r tests/e2b/requirements-framework.txt
        e2b_tests+=(tests/e2b/test_framework_e2b.py)
    fi
    EVERVM_BIN="$evervm_bin" "$e2b_env/bin/python" -m pytest -q -p no:cacheprovider \
        "${e2b_tests[@]}"
done
echo "==> API fuzzing: schemathesis against /openapi.json (process backend, bounded)"
# tests/api/README.md: a short run of every phase against `evervm serve --backend process`.
"$pyenv_dir/bin/pip" install -q --disable-pip-version-check "schemathesis==4.32.5"
EVERVM_BIN="$evervm_bin" "$pyenv_dir/bin/python" tests/api/run.py --mode ci
echo "==> Node package: build the native module (the committed loader and types must match), then its tests"
(cd bindings-node && npm ci --no-audit --no-fund --loglevel=error &&
    npx napi build --platform --js binding.cjs --dts binding.d.cts)
if ! git diff --exit-code -- bindings-node/binding.cjs bindings-node/binding.d.cts; then
    echo "bindings-node/binding.cjs or binding.d.cts differ from what napi build generates: commit them" >&2
    exit 1
fi
(cd bindings-node && EVERVM_BIN="$evervm_bin" node --test test/*.test.mjs)
echo "==> MCP server: the official TypeScript SDK over stdio and streamable HTTP (gVisor)"
(cd tests/mcp/ts && npm ci --no-audit --no-fund --loglevel=error &&
    EVERVM_BIN="$evervm_bin" node --test)
echo "==> E2B's JS SDK, unmodified, against --e2b-listen (gVisor): the newest release and the oldest that honours E2B_SANDBOX_URL"
for sdk in newest oldest; do
    (cd "tests/e2b/js-$sdk" && npm ci --no-audit --no-fund --loglevel=error &&
        EVERVM_BIN="$evervm_bin" node --test ../js/sdk.test.mjs)
done
echo "==> Node package on Node 22 (from the npm registry; the AI SDK needs it): tool helpers in their SDKs' loops, examples/node"
node22_dir="$HOME/.cache/evervm/node22"
node22="$node22_dir/node_modules/node/bin/node"
if [ ! -x "$node22" ]; then
    npm install --no-audit --no-fund --loglevel=error --prefix "$node22_dir" node@22.23.3
fi
(cd examples/node && npm ci --no-audit --no-fund --loglevel=error && npx tsc --noEmit)
(cd bindings-node && EVERVM_BIN="$evervm_bin" "$node22" --test test/frameworks/*.test.mjs)
