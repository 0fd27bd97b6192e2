# Shared by .ci/slurm-up.sh and .ci/slurm-multinode-up.sh (sourced; each defines log() first): install
# Slurm and munge where missing, start munged, and tell whether a daemon's PID file names a live process.

install_slurm() { # Debian's slurm-wlm + munge, unless both are on PATH already
  if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
  fi
}

start_munge() { # one munged in the root namespace (its socket is a file); key from the package or made here
  if [[ ! -s /etc/munge/munge.key ]]; then
    if command -v mungekey >/dev/null 2>&1; then mungekey --create --force; else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; fi
  fi
  chown munge:munge /etc/munge/munge.key /run/munge && chmod 400 /etc/munge/munge.key
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged --force
    for _ in $(seq 1 40); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.25; done
  fi
}

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }
