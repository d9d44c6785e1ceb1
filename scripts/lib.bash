# Sourced by the benchmark scripts (bench-vs-fio.sh, bench-offload.sh, ...): the
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
need_value() { [[ $# -ge 2 ]] || usage_error "$1 needs a value"; }  # need_value OPTION "$@"
need_programs() {  # need_programs BIN PROGRAM...: jq (69) and each program in BIN (66)
    local bin=$1 p
    shift
    command -v jq >/dev/null || die 69 "needs jq (apt-get install jq)"
    for p; do [[ -x $bin/$p ]] || die 66 "$bin/$p is missing (make bin/$p)"; done
}
# make_work DIR: $work, a fresh folder in DIR, removed at exit (kept when
# keep=1); an interrupt exits 130. With $text empty, $text becomes the
# repository's man pages, written into it. Needs $root.
make_work() {
    [[ -d $1 ]] || die 66 "no folder $1"
    [[ -z ${text:-} || -r $text ]] || die 66 "cannot read --text $text"
    work=$(mktemp -d "$1/${prog%.sh}.XXXXXX") || die 66 "cannot make a folder in $1"
    # shellcheck disable=SC2317  # called by the trap
    _remove_work() { ((${keep:-0})) || rm -rf -- "$work"; }
    trap _remove_work EXIT
    trap 'say interrupted; exit 130' INT TERM HUP
    if [[ -z ${text:-} ]]; then
        text=$work/text
        cat "$root"/man/*.[1-9] >"$text"
    fi
}
