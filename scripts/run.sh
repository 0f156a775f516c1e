#!/usr/bin/env bash
# One command from a fresh machine to a running kembed: installs everything (first run:
# several GB for torch), starts a local single-node Kafka broker and a worker with the
# bundled all-MiniLM-L6-v2 model, shows an embedding round trip, then keeps serving until
# Ctrl-C, which stops the worker (draining it) and the broker.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
"$root/scripts/bootstrap.sh" >/dev/null
bin="$root/.venv/bin"
export HF_HUB_OFFLINE=1

data_dir=${KEMBED_BROKER_DIR:-${KEMBED_CACHE_DIR:-$HOME/.cache/kembed}/local-broker}
bootstrap=$("$bin/python" -m scripts.kafka_local start --data-dir "$data_dir")
export KEMBED_BOOTSTRAP_SERVERS=$bootstrap
echo "==> Kafka broker at $bootstrap (data: $data_dir)"

"$bin/kembed" worker &
worker=$!
stop() {
  trap - INT TERM EXIT
  echo "==> stopping the worker and the broker"
  kill -TERM "$worker" 2>/dev/null && wait "$worker" 2>/dev/null || true
  "$bin/python" -m scripts.kafka_local stop --data-dir "$data_dir" || true
}
trap stop INT TERM EXIT

echo "==> embedding two texts through Kafka (waits for the worker to load the model)"
"$bin/kembed" embed --timeout 180 "Kafka is a distributed log." "Embeddings turn text into vectors." \
  | "$bin/python" -c "
import json, sys
result = json.load(sys.stdin)
for i, vector in enumerate(result['vectors']):
    print(f'  text {i}: dim={len(vector)}, first values {[round(x, 4) for x in vector[:4]]}')
"
echo "==> kembed is serving: KEMBED_BOOTSTRAP_SERVERS=$bootstrap .venv/bin/kembed embed \"your text\""
echo "    (Ctrl-C to stop)"
wait "$worker"
