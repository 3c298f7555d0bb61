#!/usr/bin/env sh
# Install Prometheus and Alertmanager (Debian/Ubuntu packages) for the local stack, unless both are on PATH, and kcat
# (librdkafka's command-line client: the tests publish events with it, tests/integration/test_real_producers.py),
# unless it is on PATH. Used by `make stack-deps` and .ci/run. Uses sudo when not root and sudo exists.
set -eu

PACKAGES=""
if ! { command -v prometheus >/dev/null 2>&1 &&
       { command -v alertmanager >/dev/null 2>&1 || command -v prometheus-alertmanager >/dev/null 2>&1; }; }; then
    PACKAGES="prometheus prometheus-alertmanager"
fi
if ! command -v kcat >/dev/null 2>&1; then
    PACKAGES="$PACKAGES kcat"
fi
if [ -z "$PACKAGES" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: apt-get is not available; install Prometheus 2.x and Alertmanager 0.25+" \
         "from https://prometheus.io/download/ and put prometheus and alertmanager on PATH, and kcat" \
         "(https://github.com/edenhill/kcat) on PATH" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
fi
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # one word per package
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $PACKAGES
