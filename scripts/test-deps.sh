#!/usr/bin/env bash
# System packages the test suite needs, installed when missing (Debian, as root):
#   chromium     renders the HTML reports in the browser tests
#   postgresql   the server the sweep's PostgreSQL-storage test starts (and stops) itself
#   slurm-wlm    slurmctld + slurmd (and munge) that the SLURM test starts on loopback, submits to, and stops
#   iproute2     `ip netns`: the multi-host test's two "hosts" (tests/test_cluster.py)
# Idempotent: does nothing when everything is there. Without root the affected tests skip, loudly.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || need+=(iproute2)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test-deps: installing ${need[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
else
  echo "test-deps: MISSING ${need[*]}: run 'sudo apt-get install ${need[*]}', or their tests are skipped" >&2
fi
