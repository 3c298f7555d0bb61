#!/usr/bin/env sh
# Install Prometheus and Alertmanager (Debian/Ubuntu packages) for the local stack, unless both are on PATH.
# Used by `make stack-deps` and .ci/run. Uses sudo when not root and sudo exists.
set -eu

if command -v prometheus >/dev/null 2>&1 &&
   { command -v alertmanager >/dev/null 2>&1 || command -v prometheus-alertmanager >/dev/null 2>&1; }; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: apt-get is not available; install Prometheus 2.x and Alertmanager 0.25+" \
         "from https://prometheus.io/download/ and put prometheus and alertmanager on PATH" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
fi
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus prometheus-alertmanager
