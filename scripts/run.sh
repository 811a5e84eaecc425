#!/usr/bin/env bash
# Builds evervm, starts the server on 127.0.0.1:8080 (home: $EVERVM_HOME or
# ~/.local/share/evervm), runs a first instruction on a new machine, then keeps serving until
# Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

listen="${EVERVM_LISTEN:-127.0.0.1:8080}"
echo "==> building evervm (release)"
cargo build --release --locked -p evervm-cli
evervm="$PWD/target/release/evervm"

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

echo "==> a first instruction on a new machine"
"$evervm" exec 'import sys, platform
print("hello from evervm, Python", platform.python_version())
sum(range(10))'

cat <<EOT

evervm is serving at $EVERVM_URL. In another shell:
  export EVERVM_URL=$EVERVM_URL
  export EVERVM_TOKEN=$EVERVM_TOKEN
  $evervm repl
Ctrl-C stops the server.
EOT
wait $server
