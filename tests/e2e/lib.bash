# Sourced by every tests/e2e/*.sh: a scratch directory, the programs in bin/,
# and checks that count. Each check is one test; `finish` prints the line the
# suite runner reads: "# e2e-result PASSED FAILED SKIPPED".
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${ZINF_BIN:-$ROOT/bin}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-e2e-XXXXXX")
_cleanups=()
# python3 is the interpreter itself, not a version manager's shim: pyenv's
# runs a dozen shell scripts a call (0.7 CPU-s, ten times the interpreter's
# own), which cost make test more than some of the programs under test.
# scripts/run-tests.sh resolves it once for every suite (ZINF_PYTHON).
if [[ -z ${ZINF_PYTHON-} ]] && command -v python3 >/dev/null; then
  ZINF_PYTHON=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null)
  export ZINF_PYTHON
fi
if [[ -n ${ZINF_PYTHON-} && -x $ZINF_PYTHON ]]; then
  mkdir "$TMP/.python" && ln -s "$ZINF_PYTHON" "$TMP/.python/python3" && PATH="$TMP/.python:$PATH"
fi
trap 'for c in "${_cleanups[@]}"; do eval "$c"; done; rm -rf "$TMP"' EXIT
on_exit() { _cleanups+=("$1"); }

# nap SECONDS: a pause that starts no program, for polling loops. `sleep 0.01`
# forks and execs, as does a `$(wc -l <f)` or `grep -q` test beside it: on this
# 2-core VM under make test's load a turn of such a loop cost about 37 ms of
# CPU (200 turns: 7.5 CPU-s); read -t on a pipe that nothing writes to waits
# as long with builtins only (200 turns: 0.05 CPU-s).
exec {_nap_fd}<> <(:)
nap() { read -r -t "$1" -u "$_nap_fd" _ || true; }
# ms_between T0 T1: the milliseconds from T0 to T1 (two $EPOCHREALTIME
# values: six decimals, after the locale's decimal point) in $REPLY;
# ms_since T0: from T0 to now. Without a program.
ms_between() { REPLY=$(((10#${2//[.,]/} - 10#${1//[.,]/}) / 1000)); }
ms_since() { ms_between "$1" "$EPOCHREALTIME"; }
# lines_in FILE: its number of lines in $REPLY (0 if unreadable), without wc.
lines_in() {
  local -a l=()
  mapfile -t l <"$1" 2>/dev/null
  REPLY=${#l[@]}
}
# file_has FILE TEXT: a line of FILE contains TEXT (grep -qF without a program).
file_has() {
  local l
  [[ -r $1 ]] || return 1
  while IFS= read -r l || [[ -n $l ]]; do [[ $l == *"$2"* ]] && return 0; done <"$1"
  return 1
}
# wait_holder DIR PID: until DIR's lock file records PID as its holder (a
# program that has started and taken its lock); false after 60 s or once
# PID has ended.
wait_holder() {
  local i
  for ((i = 0; i < 600; i++)); do
    file_has "$1/.zinf-lock" "\"pid\":$2," || file_has "$1/.zinf-lock" "\"pid\":$2}" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    nap 0.1
  done
  return 1
}

_pass=0 _fail=0 _skip=0
pass() { echo "ok   - $1"; _pass=$((_pass + 1)); }
fail() { echo "FAIL - $1${2:+: $2}"; _fail=$((_fail + 1)); }
skip() { echo "skip - $1: $2"; _skip=$((_skip + 1)); }

# run CMD...: stdout in $out, stderr in $err, exit status in $rc.
run() {
  out=$("$@" 2>"$TMP/.stderr")
  rc=$?
  err=$(<"$TMP/.stderr")
}
# expect_rc WANT NAME: one test on the last run's exit status.
expect_rc() {
  if [[ $rc == "$1" ]]; then pass "$2"; else fail "$2" "exit $rc, want $1; stderr: ${err:0:600}"; fi
}
# check NAME CMD...: one test that passes when CMD succeeds.
check() {
  local name=$1
  shift
  if "$@" >/dev/null; then pass "$name"; else fail "$name" "failed: $*"; fi
}
contains() { [[ $1 == *"$2"* ]]; }

# as_root CMD...: CMD as root: itself when this is root, else through
# password-less sudo (a new user's machine: scripts/fresh-check.sh runs the
# suites so); status 1 and nothing run where neither can. The checks that
# need a mount, a sysctl or a namespace use it, so they run for a user too.
if ((EUID == 0)); then
  _as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  _as_root=(sudo -n)
else
  _as_root=(false)
fi
as_root() { "${_as_root[@]}" "$@"; }
# mount_tmpfs DIR OPTIONS: a tmpfs of OPTIONS (size=...) on DIR, owned by
# this user (as_root's mount); unmount it with as_root umount DIR.
mount_tmpfs() { as_root mount -t tmpfs -o "$2,uid=$(id -u),gid=$(id -g)" tmpfs "$1" 2>/dev/null; }
has_all() { # TEXT STRING...: TEXT holds every STRING
  local t=$1
  shift
  for x; do [[ $t == *"$x"* ]] || return 1; done
}
empty_dir() { [[ -z $(ls -A "$1") ]]; }
# The programs, and the small pinned pool the suites stream through (a suite
# may set its own after sourcing this).
SH=$BIN/zinf-shard
TR=$BIN/zinf-train
SA=$BIN/zinf-sample
POOL=(--pinned 8MiB --pinned-buffer 256KiB)
# sums DIR: the sha256 of every file under DIR, by relative path.
sums() { (cd "$1" && find . -type f ! -name .zinf-lock -print0 | sort -z | xargs -0r sha256sum); }
# zs SUBCOMMAND ARGS...: zinf-shard ($SH), with the suite's pinned pool
# ($POOL) for the subcommands that stream data.
zs() {
  local sub=$1
  shift
  case $sub in
  init | verify | cat | reshard | export) "$SH" "$sub" "${POOL[@]}" "$@" ;;
  *) "$SH" "$sub" "$@" ;;
  esac
}
# fresh NAME [LAYOUT OPTIONS]: a state of the suite's $M2 (or --model)
# initialised in $W/NAME through zs; a failed init is said on stderr.
fresh() {
  local name=$1
  shift
  rm -rf "${W:?}/$name"
  local model=(--model "$M2")
  [[ " $* " == *" --model "* ]] && model=()
  zs layout "${model[@]}" "$@" | zs init --dir "$W/$name" >/dev/null 2>"$W/$name.err" ||
    echo "init of $name failed: $(<"$W/$name.err")" >&2
}
finish() {
  echo "# e2e-result $_pass $_fail $_skip"
  ((_fail == 0))
}
