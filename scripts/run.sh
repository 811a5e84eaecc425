#!/usr/bin/env bash
# Builds evervm, starts the server on 127.0.0.1:8080 (home: $EVERVM_HOME or
# ~/.local/share/evervm), runs a first instruction on a new machine, then keeps serving until
# Ctrl-C. It ends its first part with where the time went (setup, compile, runsc, the image, the
# first instruction): on a fresh machine the compile is most of it.
set -euo pipefail
cd "$(dirname "$0")/.."
began=$(date +%s)
mark=$began
took=()
phase_done() {
    local now
    now=$(date +%s)
    took+=("$1 $((now - mark)) s")
    mark=$now
}

# Only what building and serving needs (the tests' packages are scripts/test.sh's), Debian's
# runsc among them.
EVERVM_SETUP=server EVERVM_SETUP_RUNSC=background . scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
phase_done setup

# The engine prefers the pinned current runsc (scripts/runsc.sh builds it from source in about
# three CPU-minutes). On a first run Debian's serves instead, so that its build does not slow the
# compile: the pinned one is built after the first result, and later starts use it.
runsc_later=""
runsc_build=""
if ! scripts/runsc.sh --built >/dev/null; then
    if command -v runsc >/dev/null || [ -x /usr/bin/runsc ]; then
        runsc_later=1
    else
        runsc_log="$(mktemp)"
        scripts/runsc.sh >"$runsc_log" 2>&1 &
        runsc_build=$!
    fi
fi
listen="${EVERVM_LISTEN:-127.0.0.1:8080}"
# The `quick` profile: the release profile at opt-level 1, which compiles in 78 % of the time
# and serves as fast (Cargo.toml).
echo "==> building evervm (profile quick; a few minutes the first time)"
cargo build --profile quick --locked -p evervm-cli
evervm="$PWD/target/quick/evervm"
phase_done compile
if [ -n "$runsc_build" ]; then
    if ! wait "$runsc_build"; then
        cat "$runsc_log" >&2
        echo "error: building runsc failed (above); install Debian's with 'apt-get install runsc'" >&2
        exit 1
    fi
    rm -f "$runsc_log"
    phase_done "runsc (the rest of its build)"
fi

# The token first: a server on a home with none makes and prints one of its own, and the reader
# would then see two.
token="$("$evervm" token create --account default)"
"$evervm" serve --listen "$listen" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT INT TERM

export EVERVM_URL="http://$listen"
# The first start builds the root filesystem image (progress above): wait until it serves.
for _ in $(seq 600); do
    curl -sf "$EVERVM_URL/healthz" >/dev/null 2>&1 && break
    kill -0 $server 2>/dev/null || { echo "error: the server stopped (see above)" >&2; exit 1; }
    sleep 0.5
done
export EVERVM_TOKEN="$token"
phase_done "server start (the first time: its image)"

echo "==> a first instruction on a new machine"
"$evervm" exec 'import sys, platform
print("hello from evervm, Python", platform.python_version())
sum(range(10))'
phase_done "first instruction"

if [ -n "$runsc_later" ]; then
    runsc_log="${XDG_CACHE_HOME:-$HOME/.cache}/evervm/runsc-build.log"
    mkdir -p "$(dirname "$runsc_log")"
    nice -n 19 scripts/runsc.sh >"$runsc_log" 2>&1 &
fi

summary="$(printf '%s, ' "${took[@]}")"
cat <<EOT

first result $(($(date +%s) - began)) s after the start: ${summary%, }
EOT
[ -z "$runsc_later" ] || cat <<EOT
This first run serves on Debian's runsc. The pinned current gVisor runsc is building in the
background (log: $runsc_log); the server's next start uses it.
EOT
cat <<EOT

evervm is serving at $EVERVM_URL. In another shell:
  export EVERVM_URL=$EVERVM_URL
  export EVERVM_TOKEN=$EVERVM_TOKEN
  $evervm repl
Ctrl-C stops the server.
EOT
wait $server
