#!/usr/bin/env bash
# Prepares everything kembed needs on this machine, reusing what an earlier run left:
#   - a virtual environment in a cache outside the clone, keyed by requirements.lock
#     (torch alone is several GB, so it is built once per lock, not once per clone);
#   - ./.venv, a link to it, with this clone installed in editable mode (the `kembed` command);
#   - the Kafka broker jars (scripts/kafka_local/maven.py fetches them with Maven, cached by version).
#   - the test PostgreSQL's pgvector, compiled for any x86-64 CPU from Debian's source package
#     (scripts/pgvector_build.py, cached by version), and qemu-x86_64, the CPU without
#     AVX-512 its test runs on; gcc and make are installed with apt when missing (as root).
# Safe to run again and again; it only does work when something is missing or changed.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KEMBED_CACHE_DIR:-$HOME/.cache/kembed}
python=${KEMBED_PYTHON:-python3}
mkdir -p "$cache"

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "kembed needs Python >= 3.11 (set KEMBED_PYTHON)" >&2; exit 1; }
command -v java >/dev/null || { echo "kembed's local broker needs Java 17+ (java)" >&2; exit 1; }
command -v mvn >/dev/null || { echo "kembed's local broker needs Maven (mvn)" >&2; exit 1; }

key=$({ cat "$root/requirements.lock"; "$python" -c 'import sys; print(sys.version)'; } \
  | sha256sum | cut -c1-16)
venv="$cache/venv-$key"
if [ ! -f "$venv/.kembed-complete" ]; then
  echo "==> creating the virtual environment (first run: downloads torch, several GB)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade "pip>=24" "setuptools>=70" wheel
  "$venv/bin/python" -m pip install --quiet -r "$root/requirements.lock"
  touch "$venv/.kembed-complete"
fi

# Point the shared environment at this clone (cheap: metadata only). "compat" mode is a
# plain path entry, so code run from another clone's root (python -m, pytest) still imports
# that clone's packages first, never this one's.
log="$cache/bootstrap-install.log"
"$venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation \
  --config-settings editable_mode=compat -e "$root" >"$log" 2>&1 \
  || { cat "$log" >&2; exit 1; }
ln -sfn "$venv" "$root/.venv"

"$venv/bin/python" -m scripts.kafka_local fetch >/dev/null

if command -v apt-get >/dev/null; then
  if ! command -v gcc >/dev/null || ! command -v make >/dev/null; then
    [ "$(id -u)" = 0 ] || {
      echo "building pgvector for the test PostgreSQL needs gcc and make" \
        "(apt-get install gcc make libc6-dev)" >&2
      exit 1
    }
    echo "==> installing gcc and make (to build pgvector for the test PostgreSQL)" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      gcc make libc6-dev >/dev/null
  fi
  "$venv/bin/python" -m scripts.pgvector_build --emulator >/dev/null
fi
echo "$venv"
