#!/usr/bin/env bash
# System packages the test suite needs, installed when missing: Debian's chromium renders the HTML
# report in the browser test. Idempotent: does nothing when everything is there.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test-deps: installing ${need[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "test-deps: MISSING ${need[*]}: run 'sudo apt-get install ${need[*]}', or the browser test is skipped" >&2
fi
