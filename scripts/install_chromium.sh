#!/usr/bin/env bash
# CI: headless Chromium for the report's browser test (tests/test_report.py), from Debian's packages.
# Does nothing when a Chromium is already installed or the machine has no apt-get (the test then
# skips and says why); fails when apt-get exists but cannot install it, so CI never passes with
# the browser check silently skipped.
set -euo pipefail
for name in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$name" > /dev/null 2>&1; then exit 0; fi
done
if ! command -v apt-get > /dev/null 2>&1; then
  echo "no Chromium and no apt-get: the report's browser test will skip" >&2
  exit 0
fi
sudo=()
if [ "$(id -u)" != 0 ]; then sudo=(sudo -n); fi
echo "installing Chromium (apt-get) for the report's browser test"
${sudo[@]+"${sudo[@]}"} apt-get update -qq
DEBIAN_FRONTEND=noninteractive ${sudo[@]+"${sudo[@]}"} apt-get install -y -qq chromium > /dev/null
