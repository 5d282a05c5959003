# Shared by scripts/test and scripts/soak (sourced, not run).

# An S3 server for the cold-tier tests: moto 5.2.5 on a free loopback
# port, stopped by PID on exit. The tests get its endpoint from
# STELE_TEST_S3_ENDPOINT. They are #[ignore]d (a plain `cargo test` counts
# them as ignored), scripts/test runs them explicitly, and run without a
# server they fail.
start_moto() {
  local venv=target/moto-venv
  if [ ! -x "$venv/bin/moto_server" ]; then
    echo "== installing moto 5.2.5 into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet 'moto[s3]==5.2.5' flask flask-cors
  fi
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  mkdir -p target
  "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >target/moto.log 2>&1 &
  MOTO_PID=$!
  trap 'kill "$MOTO_PID" 2>/dev/null || true; wait "$MOTO_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf -X PUT "http://127.0.0.1:$port/stele-test" >/dev/null
  export STELE_TEST_S3_ENDPOINT="http://127.0.0.1:$port"
  export STELE_TEST_S3_BUCKET=stele-test
  export STELE_TEST_MOTO_SERVER="$PWD/$venv/bin/moto_server"
  echo "== moto on $STELE_TEST_S3_ENDPOINT (pid $MOTO_PID)"
}

# The HTTP API's property test (tests/tests/gateway.rs): schemathesis from
# PyPI at a pinned version in target/api-venv (log: target/api-venv.log).
SCHEMATHESIS_VERSION=4.32.5
ensure_api_tools() {
  local venv=target/api-venv
  mkdir -p target
  local have
  have=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null || true)
  if [ "$have" != "$SCHEMATHESIS_VERSION" ]; then
    echo "== installing schemathesis $SCHEMATHESIS_VERSION into $venv (PyPI)"
    { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION"; } \
      >target/api-venv.log 2>&1 \
      || { echo "   (could not install schemathesis; see target/api-venv.log)"; return 1; }
  fi
}

# The console's browser test (tests/tests/console.rs driving
# tests/browser/console.py): Debian's chromium, installed with apt-get when
# missing and root (log: target/browser-install.log), and a venv
# target/browser-venv with Playwright from PyPI at a pinned version (log:
# target/browser-venv.log). `playwright install` is never run: its browser
# download is not reachable here; the script drives /usr/bin/chromium.
# Returns non-zero, saying what is missing, when either is still missing.
PLAYWRIGHT_VERSION=1.63.0
ensure_browser() {
  local venv=target/browser-venv
  mkdir -p target
  if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing chromium (Debian package) for the console's browser test"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
      >target/browser-install.log 2>&1 \
      || echo "   (could not install chromium; see target/browser-install.log)"
  fi
  local have
  have=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("playwright"))' 2>/dev/null || true)
  if [ "$have" != "$PLAYWRIGHT_VERSION" ]; then
    echo "== installing playwright $PLAYWRIGHT_VERSION into $venv (PyPI; no browser download)"
    { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet "playwright==$PLAYWRIGHT_VERSION"; } \
      >target/browser-venv.log 2>&1 \
      || echo "   (could not install playwright; see target/browser-venv.log)"
  fi
  if [ ! -x /usr/bin/chromium ]; then
    echo "no /usr/bin/chromium (Debian's chromium package)"
    return 1
  fi
  if ! "$venv/bin/python" -c 'import playwright.sync_api' >/dev/null 2>&1; then
    echo "no playwright in $venv"
    return 1
  fi
  echo "browser: $(/usr/bin/chromium --version 2>/dev/null | head -1), playwright $PLAYWRIGHT_VERSION"
}

# The jepsen runs put each node in its own network namespace and makes
# partitions and packet loss with nftables where it can (root, iproute2,
# nftables); without them it falls back to loopback and the transport peer
# filter, and says so.
# The clock nemesis preloads libfaketime (Debian's faketime package) the
# same way.
ensure_fault_tools() {
  local missing=""
  command -v nft >/dev/null 2>&1 || missing="$missing nftables"
  [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || missing="$missing faketime"
  if [ -z "$missing" ]; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing$missing (Debian packages) for jepsen"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >target/fault-tools-install.log 2>&1 \
      || echo "   (could not install$missing; see target/fault-tools-install.log)"
  fi
}

# Every #[ignore]d test in the workspace, one line each:
# `path test_name: reason` (the reason from `#[ignore = "..."]`).
list_ignored() {
  local f
  git ls-files '*.rs' | while read -r f; do
    awk -v f="$f" '
      /^[ \t]*#\[ignore/ {
        reason = "no reason given"
        if (match($0, /"[^"]*"/)) reason = substr($0, RSTART + 1, RLENGTH - 2)
        want = 1
        next
      }
      want && match($0, /fn [A-Za-z0-9_]+/) {
        print f " " substr($0, RSTART + 3, RLENGTH - 3) ": " reason
        want = 0
      }' "$f"
  done
}

# A stele binary built without the `fault-injection` feature must refuse
# to start, naming the variable, while any unsafe switch is set
# (src/switches.rs). Each is tried on `stele dev`, the command of the
# Done-when; a binary that ignored a switch would start a cell and be
# stopped by `timeout` (exit 124), which fails here too.
check_switches_refused() {
  local bin=$1 var out rc failed=0
  for var in STELE_FAILPOINTS STELE_UNSAFE_LOCAL_READS STELE_UNSAFE_LEADER_RESTORE STELE_PEER_BLOCK_FILE; do
    local value=1
    if [ "$var" = STELE_FAILPOINTS ]; then value=journal-skip-sync; fi
    if [ "$var" = STELE_PEER_BLOCK_FILE ]; then value=/dev/null; fi
    rc=0
    out=$(env "$var=$value" timeout 15 "$bin" dev --data-dir "$(mktemp -d)" 2>&1) || rc=$?
    if [ "$rc" = 1 ] && grep -q "refusing to start: $var" <<<"$out"; then
      echo "   $var=$value $bin dev: exit $rc, refused"
    else
      echo "   $var=$value $bin dev: exit $rc, NOT refused; its last lines:"
      tail -n 3 <<<"$out" | sed "s/^/     /"
      failed=1
    fi
  done
  if [ "$failed" = 0 ]; then
    echo "unsafe switches: a build without fault-injection refuses all 4"
  else
    echo "unsafe switches: a build without fault-injection did NOT refuse them"
    return 1
  fi
}

# The fault-injection build the tests use must not refuse them.
check_switches_accepted() {
  local bin=$1
  if STELE_FAILPOINTS=journal-skip-sync "$bin" --version >/dev/null; then
    echo "   $bin (fault-injection) accepts the switches"
  else
    echo "unsafe switches: the fault-injection build refused them"
    return 1
  fi
}
