#!/usr/bin/env bash
# The whole test suite: set-up, lint, formatting, types, import rules, unit and integration
# tests (the integration tests start their own Kafka broker and load the real model).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -k batcher
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
"$root/scripts/bootstrap.sh" >/dev/null
"$root/scripts/deploy_tools.sh" >/dev/null  # hadolint, helm, docker compose (deploy/ checks)
bin="$root/.venv/bin"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "==> ruff check" && "$bin/ruff" check .
echo "==> ruff format --check" && "$bin/ruff" format --check .
echo "==> mypy --strict" && "$bin/mypy"
echo "==> import rules" && "$bin/lint-imports"
echo "==> pytest" && "$bin/python" -m pytest "$@"
