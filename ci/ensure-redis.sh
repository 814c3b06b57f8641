#!/usr/bin/env bash
# Makes sure redis-server (Debian's package) is on PATH: the cluster tests run a real one.
# Installs it with apt-get when missing (CI runs as root); prints its path.
set -euo pipefail
if ! command -v redis-server > /dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "redis-server is missing and this user cannot install it; run: sudo apt-get install -y redis-server" >&2
    exit 1
  fi
  echo "installing redis-server (Debian package) for the cluster tests" >&2
  apt-get update -qq > /dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server > /dev/null
  # the package starts a system instance on 6379; the tests start their own
  (systemctl disable --now redis-server 2> /dev/null || service redis-server stop 2> /dev/null || true) > /dev/null
fi
command -v redis-server
