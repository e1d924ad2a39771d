# Shared by the scripts of experiments/gpu/ (sourced, not run):
#   stamp MESSAGE...                 one line with the time
#   run LIMIT_SECONDS LOG COMMAND... one command under a time limit (TERM, then KILL a
#                                    minute later), its output in LOG; says its exit
#                                    status, prints LOG's last RUN_TAIL lines (default 0)
#                                    and returns 0, so one failed stage does not stop the
#                                    next; DRY_RUN=1 prints the command instead.
stamp() { echo "[$(date +%T)] $*"; }
run() {
  local limit=$1 log=$2
  shift 2
  if [[ -n ${DRY_RUN:-} ]]; then
    echo "$*"
    return 0
  fi
  stamp "$* (log $log)"
  timeout -s TERM -k 60 "$limit" "$@" >"$log" 2>&1
  stamp "exit $?"
  if [[ ${RUN_TAIL:-0} -gt 0 ]]; then tail -n "$RUN_TAIL" "$log"; fi
  return 0
}
