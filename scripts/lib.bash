# Sourced by the benchmark scripts (bench-vs-fio.sh, bench-offload.sh): the
# program's name, its --help from its own header comment, and the messages and
# exit codes of zinf's contract (64 usage; the caller's status otherwise).
prog=${0##*/}

usage() {  # the script's header comment, without the #! line
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}
die() {  # die STATUS MESSAGE
    local status=$1
    shift
    printf '%s: %s\n' "$prog" "$*" >&2
    exit "$status"
}
usage_error() {
    printf '%s: %s\nRun %s --help for the options.\n' "$prog" "$*" "$prog" >&2
    exit 64
}
say() { printf '%s: %s\n' "$prog" "$*" >&2; }
