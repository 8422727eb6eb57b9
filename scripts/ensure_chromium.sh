#!/usr/bin/env bash
# Make sure a Chromium exists for the test that screenshots verify's HTML report in a real browser.
set -euo pipefail
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null; then echo "chromium: $(command -v "$b")"; exit 0; fi
done
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  echo "chromium: installing the chromium package with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  exit 0
fi
echo "chromium: missing; install it (e.g. 'sudo apt-get install -y chromium'); the report screenshot test needs it" >&2
exit 1
