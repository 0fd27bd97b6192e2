#!/bin/bash
# Sourced by the device scripts (race.sh, live.sh, mtp.sh, truth.sh, features.sh): the one wait for a
# detached campaign's last line.
#   wait_line LOG DONE_ERE [FAIL_ERE [PROCESS]]
# returns once LOG has a line matching DONE_ERE (sets wait_state=done), or one matching FAIL_ERE while
# PROCESS (a pgrep -f pattern; none given: at once) no longer runs (wait_state=failed), or once the call's
# budget ($budget seconds from $t0) is spent (wait_state=running).
wait_line() {
  local log=$1 done_re=$2 fail_re=${3:-} process=${4:-}
  wait_state=running
  while [ $(( $(date +%s) - t0 )) -lt "$budget" ]; do
    grep -qE "$done_re" "$log" 2>/dev/null && { wait_state=done; return 0; }
    if [ -n "$fail_re" ] && grep -qE "$fail_re" "$log" 2>/dev/null; then
      if [ -z "$process" ] || ! pgrep -f "$process" >/dev/null; then wait_state=failed; return 1; fi
    fi
    sleep 5
  done
  return 1
}
