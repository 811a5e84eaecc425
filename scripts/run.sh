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

# Only what building and serving needs (the tests' packages are scripts/test.sh's); the pinned
# runsc is built beside the compile below.
EVERVM_SETUP=server EVERVM_SETUP_RUNSC=background . scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
phase_done setup

runsc_log="$(mktemp)"
scripts/runsc.sh >"$runsc_log" 2>&1 &
runsc_build=$!
listen="${EVERVM_LISTEN:-127.0.0.1:8080}"
echo "==> building evervm (release; a few minutes the first time)"
cargo build --release --locked -p evervm-cli
evervm="$PWD/target/release/evervm"
phase_done compile
if ! wait $runsc_build; then
    cat "$runsc_log" >&2
    echo "error: building runsc failed (above); Debian's runsc serves meanwhile if installed" >&2
fi
rm -f "$runsc_log"
phase_done "runsc (the rest of its build)"

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
phase_done "server start (the image, the first time)"

echo "==> a first instruction on a new machine"
"$evervm" exec 'import sys, platform
print("hello from evervm, Python", platform.python_version())
sum(range(10))'
phase_done "first instruction"

cat <<EOT

first result $(($(date +%s) - began)) s after the start: $(IFS=,; echo "${took[*]}" | sed 's/,/, /g')

evervm is serving at $EVERVM_URL. In another shell:
  export EVERVM_URL=$EVERVM_URL
  export EVERVM_TOKEN=$EVERVM_TOKEN
  $evervm repl
Ctrl-C stops the server.
EOT
wait $server
