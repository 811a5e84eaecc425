#!/usr/bin/env bash
# Runs every check and test of evervm: formatting, clippy, and the whole test suite.
# This is the command the README gives and the one CI runs.
#
# Where the time goes: each stage prints its wall time as it ends ("<== stage: N s") and the run
# ends with a table of them all. The engine is compiled once per profile: one `cargo build` makes
# the test binaries and the Python and Node extension modules with the same features, and the
# packages are made from those builds. What comes from outside (Python and npm packages, the Go
# programs, the images' Debian packages) is fetched and built in the background while the CPU
# compiles, and awaited where it is first needed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/stages.sh
trap 'stage_report; scripts/postgres.sh stop "$pg_dir" >/dev/null 2>&1 || true; scripts/seaweedfs.sh stop "$s3_dir" >/dev/null 2>&1 || true' EXIT
pg_dir="${TMPDIR:-/tmp}/evervm-test-postgres"
s3_dir="${TMPDIR:-/tmp}/evervm-test-s3"

stage setup "Debian packages and Rust (scripts/setup.sh)"
EVERVM_SETUP_RUNSC=background
. scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cache="${XDG_CACHE_HOME:-$HOME/.cache}"
# npm's downloads are kept under ~/.cache like the others'.
export npm_config_cache="${npm_config_cache:-$cache/npm}"
# The end-to-end tests keep machines' snapshots on disk: say how much room there is, so that a
# test refused for want of disk reads as that.
echo "free disk: $(df -h --output=avail "${TMPDIR:-/tmp}" | tail -1 | tr -d ' ') in ${TMPDIR:-/tmp}, $(df -h --output=avail . | tail -1 | tr -d ' ') here"

# Everything from outside, fetched while the Rust build below keeps the CPU busy.
pyenv_dir="${EVERVM_PYENV:-$cache/evervm/pyenv}"
python_test_env() {
    [ -x "$pyenv_dir/bin/python" ] || python3 -m venv "$pyenv_dir"
    # The Swift, MCP, fuzzing and docs suites' tools (the Python package's tests run in a venv of
    # their own, from the wheel: stage python).
    "$pyenv_dir/bin/pip" install -q --disable-pip-version-check "pytest==8.4.2" \
        "tree-sitter==0.26.1" "tree-sitter-swift==0.7.4" "mcp==2.3.0" "schemathesis==4.32.5"
}
# E2B's Python SDK, the newest releases and the oldest that honour E2B_SANDBOX_URL; LangChain's
# Deep Agents with E2B's langchain-e2b backend on the newest.
e2b_python_env() {
    local name="$1" env="$cache/evervm/e2b-$1"
    shift
    [ -x "$env/bin/python" ] || python3 -m venv "$env"
    "$env/bin/pip" install -q --disable-pip-version-check "$@" "pytest==8.4.2"
}
# Releases of E2B's Python SDK older than those that honour E2B_SANDBOX_URL: the oldest there
# is, CrewAI's pins, and the last code interpreter that ignores it on an accepted core
# (tests/e2b/test_sdk_leaks.py checks that each reaches only evervm).
leak_envs=(v1 crewai ci28)
e2b_leak_envs() {
    local name env
    for name in "${leak_envs[@]}"; do
        env="$cache/evervm/e2b-leak-$name"
        [ -x "$env/bin/python" ] || python3 -m venv "$env"
        case "$name" in
            v1) set -- "e2b-code-interpreter==1.0.0" "e2b==1.0.0" ;;
            crewai) set -- "e2b-code-interpreter==2.6.0" "e2b==2.20.0" ;;
            ci28) set -- "e2b-code-interpreter==2.8.1" "e2b==2.26.0" ;;
        esac
        "$env/bin/pip" install -q --disable-pip-version-check "$@"
    done
}
# The Jupyter differential tests' reference kernel: Debian's ipykernel (scripts/setup.sh) on
# /usr/bin/python3 with the data image's own pinned wheels, as the image has them. A venv without
# the host's site packages (a host's Debian numpy 1 extensions, numexpr say, break numpy 2), with
# the files of Debian's ipykernel and jupyter_client and what they depend on linked in.
reference_env="$cache/evervm/reference-kernel"
reference_kernel_env() {
    [ -x "$reference_env/bin/python" ] || /usr/bin/python3 -m venv "$reference_env"
    local site debian="$reference_env/debian"
    site="$("$reference_env/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    rm -rf "$debian"
    mkdir -p "$debian"
    local package entry
    for package in $(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances python3-ipykernel python3-jupyter-client |
        grep -E '^python3-' | sort -u); do
        dpkg -L "$package" 2>/dev/null || true
    done | sed -n 's|^/usr/lib/python3/dist-packages/\([^/]*\).*|\1|p' | sort -u >"$debian.list"
    while read -r entry; do ln -s "/usr/lib/python3/dist-packages/$entry" "$debian/$entry"; done <"$debian.list"
    echo "$debian" >"$site/debian-jupyter.pth"
    "$reference_env/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps \
        -r engine/src/guest/image/data-wheels.txt
}
# Node 22 (the AI SDK needs it), from the npm registry.
node22_dir="$cache/evervm/node22"
npm_packages() {
    local dir
    for dir in bindings-node tests/mcp/ts tests/e2b/js-newest tests/e2b/js-oldest tests/e2b/js-leaks \
        examples/node; do
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    done
    [ -x "$node22_dir/node_modules/node/bin/node" ] ||
        npm install --no-audit --no-fund --loglevel=error --prefix "$node22_dir" node@22.23.3
}
# mdBook for the book (docs/), pinned, built once into the cache; only `build` is used, so
# without its live server and file watcher (a third of the compile). Started with the two lanes
# at the end, whose suites leave half the CPU idle, rather than beside the engine's build.
mdbook_dir="$cache/evervm/mdbook-0.5.4-build"
mdbook_tool() {
    [ -x "$mdbook_dir/bin/mdbook" ] ||
        env -u RUSTC_WORKSPACE_WRAPPER cargo install --quiet --locked mdbook --version 0.5.4 \
            --no-default-features \
            --features search --root "$mdbook_dir"
}
go_programs() {
    # The pinned current runsc (built), then SeaweedFS (the bucket tests' S3 server, fetched), each once.
    scripts/runsc.sh
    scripts/seaweedfs.sh build
}
background go go_programs
background python python_test_env
background e2b-newest e2b_python_env newest "e2b-code-interpreter==2.11.5" "e2b==2.63.0" \
    "jupyter_client==8.6.3" -r tests/e2b/requirements-framework.txt
background reference reference_kernel_env
background e2b-oldest e2b_python_env oldest "e2b-code-interpreter==2.9.0" "e2b==2.26.0"
background e2b-leaks e2b_leak_envs
background npm npm_packages

# One build from scratch: incremental state would only double what the build keeps on disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
stage fmt "cargo fmt --check"
cargo fmt --all -- --check
# The one build of the engine for the tests: every test binary, the CLI, the examples and the
# Python and Node extension modules (their libraries have no Rust tests), in one invocation so
# that features are unified once. Every later cargo command selects the same packages, so it
# finds this build fresh. The Swift package is built on its own below: it is the remote-only
# client, without the engine's runtime, by design.
# The host's triple is named, because napi build always names one (and a build for a named
# triple has a directory of its own).
host="$(rustc -vV | sed -n 's/^host: //p')"
workspace=(--workspace --locked --exclude evervm-swift --target "$host")
target_dir="$(realpath "${CARGO_TARGET_DIR:-target}")"
evervm_bin="$target_dir/$host/debug/evervm"
# Clippy lints the workspace's crates as this build compiles them (scripts/clippy-rustc), as
# `cargo clippy --workspace --all-targets -- -D warnings` would, without a second compile of
# everything in its check mode. Every cargo command below (maturin's and napi's too) keeps the
# wrapper, so each finds the crates it shares with this build fresh.
export RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/clippy-rustc"
stage build "cargo build, linted by clippy: the tests, the CLI, the Python and Node modules (debug)"
python3 scripts/features_unified.py evervm-python evervm-node
cargo build "${workspace[@]}" --all-targets
echo "the build takes $(du -sh "$target_dir" | cut -f1) on disk; $(df -h --output=avail . | tail -1 | tr -d ' ') free"

# Root filesystem images are shared by every test engine (and kept between runs); one ready
# sandbox per engine is enough for the tests.
export EVERVM_IMAGES="${EVERVM_IMAGES:-$cache/evervm/images}"
export EVERVM_POOL_SIZE="${EVERVM_POOL_SIZE:-1}"
images() {
    "$evervm_bin" image build --profile minimal
    "$evervm_bin" image build --profile data
}
background images images

stage node-build "Node package: the native module from the build above (the committed loader and types must match)"
await npm
(cd bindings-node && npx napi build --platform --target "$host" --js binding.cjs --dts binding.d.cts)
if ! git diff --exit-code -- bindings-node/binding.cjs bindings-node/binding.d.cts; then
    echo "bindings-node/binding.cjs or binding.d.cts differ from what napi build generates: commit them" >&2
    exit 1
fi

stage dist "the release artifacts, packaged from this build (scripts/dist.sh --profile dev): wheel, sdist, npm tarballs, the evervm binary"
# The same packaging as a release (stripped, optimised: scripts/dist.sh), of the debug build the
# tests use: the Python and Node packages' tests and the command below run from these artifacts.
dist_dir="$PWD/dist"
EVERVM_NODE_BUILT="$PWD/bindings-node" scripts/dist.sh --profile dev --out "$dist_dir"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
installed="$(mktemp -d)"
tar -xzf "$dist_dir/evervm-$version-$host.tar.gz" -C "$installed"
dist_bin="$installed/evervm-$version-$host/evervm"
# What a user without Rust has: PATH without any directory holding cargo or rustc.
nocargo_path="$(tr ':' '\n' <<<"$PATH" | while read -r dir; do
    [ -x "$dir/cargo" ] || [ -x "$dir/rustc" ] || echo "$dir"; done | paste -sd:)"
if PATH="$nocargo_path" command -v cargo rustc; then
    echo "cargo or rustc is still on PATH for the install tests (above)" >&2
    exit 1
fi

stage services "PostgreSQL (Debian's) and SeaweedFS (S3), on loopback, for the store's and bucket's tests"
await go
EVERVM_TEST_POSTGRES="$(scripts/postgres.sh start "$pg_dir" "${EVERVM_TEST_POSTGRES_PORT:-55432}")"
export EVERVM_TEST_POSTGRES EVERVM_TEST_POSTGRES_CA="$pg_dir/ca.pem"
# The standard AWS environment reaches it, as it would reach any bucket.
AWS_ENDPOINT_URL="$(scripts/seaweedfs.sh start "$s3_dir" "${EVERVM_TEST_S3_PORT:-58333}" evervm-test)"
export AWS_ENDPOINT_URL AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=evervm-test
export AWS_SECRET_ACCESS_KEY=evervm-test-secret EVERVM_TEST_S3=s3://evervm-test
await images

stage cargo-test "cargo test: every Rust suite, the end-to-end ones on the current runsc"
cargo test "${workspace[@]}"

stage e2e-debian-runsc "the end-to-end tests whose outcome depends on the runsc, on Debian's (2022, ptrace)"
# Older hosts and old snapshots use Debian's runsc. The rest of the suite exercises the engine,
# not the runsc, and ran above. Each kept because:
debian_runsc_tests=(
    # its checkpoint and restore, the heart of swap
    gvisor::state_survives_swap_out_and_restore
    # its snapshots restored by a new engine, and idle swap on its timing
    gvisor::idle_machines_swap_out_and_everything_survives_an_engine_restart
    # the engine's version check of snapshots against this runsc's binary
    gvisor::snapshots_survive_an_upgrade_of_runsc
    # compressed snapshots restored and forked by it
    gvisor::swapped_snapshots_are_compressed_in_the_background_and_still_restore_and_fork
    # forks (restores of a live checkpoint) and checkpoints with rollback
    forever::forks_are_independent_and_draw_different_numbers
    forever::checkpoints_roll_a_machine_back
    # base snapshots of the images made and restored by it
    forever::new_machines_start_from_the_image_base_snapshot
    # isolation under its ptrace platform: the host's files, processes and network stay hidden
    gvisor::the_host_file_system_is_invisible
    isolation::host_processes_are_invisible
    isolation::no_network_even_to_a_loopback_port_the_host_opened
    # memory limits as its ptrace platform enforces them (RLIMIT_AS, then the cgroup backstop)
    isolation::memory_limit_gives_memory_error_and_hurts_no_one_else
    gvisor::memory_the_address_space_limit_misses_is_stopped_by_the_backstop
    # a machine with a network is refused as unsupported (this runsc cannot give one), not broken
    network::machines_reach_what_their_policy_allows_across_swap_and_fork
)
if [ -x /usr/bin/runsc ]; then
    EVERVM_RUNSC=/usr/bin/runsc EVERVM_TEST_BACKENDS=gvisor \
        cargo test "${workspace[@]}" --test e2e -- --exact "${debian_runsc_tests[@]}"
else
    echo "skipping: Debian's runsc is not installed"
fi

stage load "load program, small: fails on any error or order violation, never on timing"
# gVisor where it works (swaps included), else the process backend; --max-seconds only stops a
# hang (the run takes about a minute on gVisor, seconds on the process backend).
"$target_dir/$host/debug/load" --backend auto --clients 8 --instructions 50 --machines 4 \
    --swap-every-ms 250 --max-seconds 300

# Two lanes from here: these suites wait on sandboxes far more than on the CPU (about half of
# two cores each), so the Swift and Node ones run in the background beside the Python ones.
other_lane() {
    stage_current=""
    stage swift-build "Swift package: build the remote-only library and generate its sources"
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

    stage swift "Swift package: its FFI surface through uniffi's Python bindings, every Swift file parsed"
    # No Swift compiler here: the Swift files are parsed (tree-sitter's Swift grammar) instead.
    EVERVM_FFI_DIR="$ffi_dir" EVERVM_BIN="$evervm_bin" "$pyenv_dir/bin/python" -m pytest -q \
        -p no:cacheprovider bindings-swift/tests
    rm -rf "$ffi_dir"

    stage node "Node package: evervm and evervm-<platform> from dist/, installed offline in a fresh project with no cargo on PATH, and its tests there"
    local app repo="$PWD"
    app="$(mktemp -d)/app"
    mkdir -p "$app"
    echo '{"name": "evervm-install-test", "private": true}' >"$app/package.json"
    cp -r bindings-node/test "$app/test"
    # The package's own test dependencies (the AI SDK's and the Agents SDK's), at its pins, from
    # the registry (`npm ci` cached their tarballs, not their metadata); then the two tarballs,
    # offline (the other platforms' packages, never published, are optional and skipped).
    mapfile -t test_deps < <(node -p 'Object.entries(require("./bindings-node/package.json").devDependencies)
        .filter(([name]) => !name.startsWith("@napi-rs/")).map(([name, v]) => `${name}@${v}`).join("\n")')
    (cd "$app" && PATH="$nocargo_path" npm install --prefer-offline --no-audit --no-fund \
        --loglevel=error "${test_deps[@]}")
    (cd "$app" && PATH="$nocargo_path" npm install --offline --no-audit --no-fund --loglevel=error \
        "$dist_dir/evervm-$version.tgz" "$dist_dir"/evervm-*-"$version".tgz)
    (cd "$app" && PATH="$nocargo_path" EVERVM_BIN="$dist_bin" EVERVM_REPO="$repo" EVERVM_DIST="$dist_dir" \
        node --test test/*.test.mjs)

    stage mcp-ts "MCP server: the official TypeScript SDK over stdio and streamable HTTP (gVisor)"
    (cd tests/mcp/ts && EVERVM_BIN="$evervm_bin" node --test)

    stage e2b-js "E2B's JS SDK, unmodified, against --e2b-listen (gVisor): the newest release and the oldest that honours E2B_SANDBOX_URL"
    for sdk in newest oldest; do
        (cd "tests/e2b/js-$sdk" && EVERVM_BIN="$evervm_bin" node --test ../js/sdk.test.mjs)
    done

    stage node22 "Node package on Node 22 (the AI SDK needs it), installed as above: tool helpers in their SDKs' loops, examples/node"
    (cd examples/node && npx tsc --noEmit)
    (cd "$app" && PATH="$nocargo_path" EVERVM_BIN="$dist_bin" EVERVM_REPO="$repo" \
        "$node22_dir/node_modules/node/bin/node" --test test/frameworks/*.test.mjs)
    stage_end
}
await npm
await python
background lanes other_lane
background mdbook mdbook_tool

stage python "Python package: the wheel from dist/ in a fresh venv with no cargo on PATH, and its tests there"
install_venv="$installed/venv"
python3 -m venv "$install_venv"
# The wheel with the package's own test and extra requirements (pyproject.toml).
PATH="$nocargo_path" "$install_venv/bin/pip" install -q --disable-pip-version-check \
    "$(ls "$dist_dir"/evervm-"$version"-*.whl)[test,langchain]"
"$install_venv/bin/python" -c 'import evervm, sys; sys.exit(0 if "site-packages" in evervm.__file__ else f"evervm comes from {evervm.__file__}")'
PATH="$nocargo_path" EVERVM_BIN="$dist_bin" "$install_venv/bin/python" -m pytest -q -p no:cacheprovider \
    bindings-python/tests

stage mcp-python "MCP server: the official MCP Python SDK over stdio and streamable HTTP (gVisor)"
EVERVM_BIN="$evervm_bin" "$pyenv_dir/bin/python" -m pytest -q -p no:cacheprovider tests/mcp/test_mcp.py

stage e2b-python "E2B's Python SDK, unmodified, against --e2b-listen (gVisor): newest and oldest, sync and async; LangChain's and smolagents' E2B executors on the newest; Jupyter cells against a real kernel; TLS on every listener; older releases reach only evervm"
await e2b-newest
await reference
EVERVM_BIN="$evervm_bin" EVERVM_REFERENCE_PYTHON="$reference_env/bin/python" \
    "$cache/evervm/e2b-newest/bin/python" -m pytest -q -p no:cacheprovider \
    tests/e2b/test_e2b_sdk.py tests/e2b/test_framework_e2b.py tests/e2b/test_smolagents_e2b.py \
    tests/e2b/test_jupyter_differential.py tests/e2b/test_tls.py
await e2b-oldest
EVERVM_BIN="$evervm_bin" "$cache/evervm/e2b-oldest/bin/python" -m pytest -q -p no:cacheprovider \
    tests/e2b/test_e2b_sdk.py
await e2b-leaks
await npm
leak_pythons=$(printf "$cache/evervm/e2b-leak-%s/bin/python:" "${leak_envs[@]}")
EVERVM_BIN="$evervm_bin" EVERVM_E2B_LEAK_PYTHONS="$leak_pythons" \
    "$cache/evervm/e2b-newest/bin/python" -m pytest -q -p no:cacheprovider tests/e2b/test_sdk_leaks.py

stage fuzz "API fuzzing: schemathesis against /openapi.json (process backend, bounded)"
# tests/api/README.md: a short run of every phase against `evervm serve --backend process`.
EVERVM_BIN="$evervm_bin" "$pyenv_dir/bin/python" tests/api/run.py --mode ci

stage book "the book builds (mdBook), its links hold, and the README's and the book's runnable blocks run (gVisor)"
await mdbook
python3 scripts/check_docs.py --self-test
python3 scripts/check_docs.py
book_out="$(mktemp -d)"
"$mdbook_dir/bin/mdbook" build docs --dest-dir "$book_out"
test -s "$book_out/index.html" && test -s "$book_out/getting-started.html"
rm -rf "$book_out"
python3 scripts/run_doc_blocks.py --evervm "$evervm_bin" --python "$install_venv/bin/python"

await lanes
