#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine (as root): Debian packages
# (prometheus as the test oracle, tmux for the terminal test) and fleetscope with its test extras.
# Where prometheus and tmux are both on the PATH already, the apt step is skipped (any user, any
# system); otherwise it needs root and apt-get, and says so in one line if either is missing.
set -euo pipefail

cd "$(dirname "$0")/.."

section() { printf '\n===== %s =====\n' "$*"; }
started=$SECONDS

export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1

install_packages() {
  # Debian's prometheus package enables and starts a system daemon on 0.0.0.0:9090 where
  # services can start (systemd / sysvinit), and its Recommends pull in
  # prometheus-node-exporter (a daemon on :9100). The tests start their own Prometheus on
  # free loopback ports, so: skip Recommends, and forbid service starts during the install
  # with a temporary policy-rc.d (honoured by invoke-rc.d and deb-systemd-invoke) unless the
  # machine already has one.
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    own_policy=1
  fi
  cleanup_policy() { if [[ $own_policy == 1 ]]; then rm -f "$policy"; fi; }
  trap cleanup_policy EXIT

  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    prometheus tmux >/dev/null
  cleanup_policy
  own_policy=0
}

stop_daemons() {
  # If a prometheus / node-exporter daemon runs anyway (e.g. started earlier on this
  # machine), stop it and keep it from starting again. systemctl may be absent, or present
  # without systemd running, so guard every step.
  for svc in prometheus prometheus-node-exporter; do
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    elif [[ -x /etc/init.d/$svc ]] && [[ -e /run/$svc/$svc.pid ]]; then
      /etc/init.d/"$svc" stop >/dev/null 2>&1 || true
    fi
  done
}

section "System packages: prometheus (test oracle), tmux"
if command -v prometheus >/dev/null 2>&1 && command -v tmux >/dev/null 2>&1; then
  echo "prometheus and tmux are installed already: apt-get skipped"
else
  need="install-test-deps: prometheus and tmux are needed"
  if [[ $(id -u) != 0 ]]; then
    echo "$need; installing them needs root (or install them yourself, then run this again)" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$need; there is no apt-get here: install them yourself, then run this again" >&2
    exit 1
  fi
  install_packages
fi
if [[ $(id -u) == 0 ]]; then
  stop_daemons
fi
prometheus --version 2>&1 | head -n 1
tmux -V
if command -v ss >/dev/null 2>&1; then
  busy=$(ss -Hltn 2>/dev/null | awk '{print $4}' | grep -E ':(9090|9100)$' || true)
  if [[ -n $busy ]]; then
    echo "note: still listening (not used by the tests, which pick free ports): $busy"
  fi
fi

section "Python package: pip install -e .[test]"
python3 --version
# PIP_BREAK_SYSTEM_PACKAGES only matters if python3 is Debian's externally-managed one.
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q -e ".[test]"
