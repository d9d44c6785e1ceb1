#!/usr/bin/env bash
# Runs make targets from a clean clone inside a fresh Debian 12 root, as a new
# user on a new machine would: what CI runs (.ci/run), so that a package this
# machine has and a user's has not fails the check, not the user.
#
#   scripts/fresh-check.sh                  make demo, then make test (the README's quick start)
#   scripts/fresh-check.sh --target fuzz --make-args FUZZ_SECONDS=10
#
# The root: debootstrap --variant=minbase of Debian 12 with git, make, sudo and
# ca-certificates, nothing else, made once and cached under --cache (made in
# about a minute where it is not), then given what an installed Debian has and
# debootstrap leaves out: the host name in /etc/hosts, a /dev with its own
# pseudo-terminals and shared memory, /proc, /sys, the apt sources of an
# installed system (bookworm, -updates, -security), and a user with
# password-less sudo. Each run copies it, clones the commit into the user's
# home and runs each `make TARGET` there with the user's limits (a login's
# 8 MiB of locked memory); the copy is removed at the end. Processes live in
# their own PID, mount and UTS namespaces, so nothing a test starts outlives
# the run. The CUDA toolkit, when /usr/local/cuda exists here, is bound into
# the root read-only, so the cuda objects still compile. Downloaded .deb files
# are kept under --cache between runs (apt-get still installs each one: the
# install step is what is checked; only the download is saved).
#
# Options:
#   --target T        run `make T` (repeatable, in order); default: demo test
#   --make-args "A"   words added to every make command (FUZZ_SECONDS=10, ...)
#   --commit REV      the commit to clone (default: HEAD); uncommitted changes
#                     are never in the check, and it says so when there are some
#   --repo DIR        the repository to clone from (default: this one)
#   --user NAME       who runs the targets: a new user with sudo (default
#                     zinf), or root
#   --cache DIR       the cached root and packages (default /var/tmp/zinf-fresh)
#   --mirror URL      the Debian mirror (default http://deb.debian.org/debian)
#   --timeout MIN     each target's limit in minutes (default 60)
#   --rebuild         make the cached root again
#   --keep            keep this run's root (its path is printed)
#   --in DIR          run in DIR, a root an earlier --keep kept, as it is (no
#                     new copy, no clone; kept afterwards): to look into a failure
#   --command "CMD"   run CMD with bash in the clone instead of make targets
#   --log FILE        everything the targets print, also into FILE
#   -h, --help        this text
# Needs root (debootstrap, chroot, mounts, namespaces) and the network to a
# Debian mirror; installs debootstrap when it is missing.
# Exit: 0 every target passed; otherwise the first failing target's status
# (make's 2; 124 past --timeout); 64 usage; 69 the root cannot be made (not
# root, no debootstrap, no mirror); 70 the run could not be set up.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib.bash
. "$root/scripts/lib.bash"

targets=() make_args='' commit=HEAD repo=$root user=zinf cache=/var/tmp/zinf-fresh
mirror=http://deb.debian.org/debian timeout_min=60 rebuild=0 keep=0 log='' in='' command=''
while (($#)); do
    case $1 in
    --target) need_value "$@"; targets+=("$2"); shift ;;
    --make-args) need_value "$@"; make_args=$2; shift ;;
    --commit) need_value "$@"; commit=$2; shift ;;
    --repo) need_value "$@"; repo=$2; shift ;;
    --user) need_value "$@"; user=$2; shift ;;
    --cache) need_value "$@"; cache=$2; shift ;;
    --mirror) need_value "$@"; mirror=$2; shift ;;
    --timeout) need_value "$@"; timeout_min=$2; shift ;;
    --rebuild) rebuild=1 ;;
    --keep) keep=1 ;;
    --in) need_value "$@"; in=$2; shift ;;
    --command) need_value "$@"; command=$2; shift ;;
    --log) need_value "$@"; log=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage_error "unknown option '$1'" ;;
    esac
    shift
done
((${#targets[@]})) || targets=(demo test)
[[ -z $command ]] || targets=(command)
[[ -z $in || -d $in/home || -d $in/root ]] || usage_error "--in: $in is not a kept root"
[[ $timeout_min =~ ^[1-9][0-9]*$ ]] || usage_error "--timeout takes whole minutes, not '$timeout_min'"
[[ $user =~ ^[a-z_][a-z0-9_-]*$ ]] || usage_error "--user: '$user' is not a user name"
for t in "${targets[@]}"; do
    [[ $t =~ ^[A-Za-z0-9_.-]+$ ]] || usage_error "--target: '$t' is not a make target"
done
[[ $make_args =~ ^[A-Za-z0-9_=.,/\ -]*$ ]] || usage_error "--make-args: only NAME=VALUE words, not '$make_args'"
((EUID == 0)) || die 69 "needs root (debootstrap, chroot and mounts); run it with sudo"
git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 || usage_error "--repo: $repo is not a git repository"
rev=$(git -C "$repo" rev-parse --verify -q "$commit^{commit}") || usage_error "--commit: no commit '$commit' in $repo"
[[ -z $(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null) || $commit != HEAD ]] ||
    say "note: $repo has uncommitted changes; the check clones commit ${rev:0:12}, without them"

# --- the cached base root ----------------------------------------------------
# Its name holds what it is made from, so a change here makes a new one.
recipe="bookworm minbase git,make,sudo,ca-certificates $mirror user=$user v1"
base=$cache/base-$(printf '%s' "$recipe" | sha256sum | cut -c1-12)
mkdir -p "$cache" "$cache/apt-archives/partial" "$cache/runs"

make_base() {
    command -v debootstrap >/dev/null || {
        say "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null ||
            { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null; } ||
            die 69 "cannot install debootstrap (apt-get install debootstrap)"
    }
    local tmp=$base.tmp-$$
    rm -rf --one-file-system "$tmp"
    say "making a minimal Debian 12 root in $base (about a minute, once)"
    SECONDS=0
    debootstrap --variant=minbase --include=git,make,sudo,ca-certificates bookworm "$tmp" "$mirror" \
        >"$tmp.log" 2>&1 || { tail -n 5 "$tmp.log" >&2; rm -rf --one-file-system "$tmp"; die 69 "debootstrap failed (log: $tmp.log)"; }
    # What an installed Debian 12 has and debootstrap leaves out.
    rm -f "$tmp/etc/apt/sources.list"
    cat >"$tmp/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    echo zinf-fresh >"$tmp/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\tzinf-fresh\n\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n' \
        >"$tmp/etc/hosts"
    # A new machine's package lists come with its first apt-get update.
    rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/archives/*.deb
    if [[ $user != root ]]; then
        chroot "$tmp" useradd --create-home --shell /bin/bash --groups sudo "$user"
        echo "$user ALL=(ALL) NOPASSWD: ALL" >"$tmp/etc/sudoers.d/$user"
        chmod 440 "$tmp/etc/sudoers.d/$user"
    fi
    mv "$tmp.log" "$tmp/debootstrap.log"
    mv "$tmp" "$base"
    say "root made in ${SECONDS} s"
}
[[ -n $in ]] || {
    flock 9
    if ((rebuild)) && [[ -d $base ]]; then rm -rf --one-file-system "$base"; fi
    [[ -d $base ]] || make_base
} 9>"$cache/lock"

# --- this run's copy ---------------------------------------------------------
stamp=$(date +%Y%m%d-%H%M%S)-$$
run=$cache/runs/$stamp
[[ -z $in ]] || { run=$(cd "$in" && pwd); keep=1; }
cleanup() {
    # The namespace's mounts went with it; --one-file-system keeps rm out of
    # anything still bound (the CUDA toolkit) whatever happened.
    if ((keep)); then say "kept the root: $run"; else rm -rf --one-file-system "$run"; fi
}
trap cleanup EXIT
trap 'say interrupted; exit 130' INT TERM HUP
home=/root
[[ $user == root ]] || home=/home/$user
if [[ -z $in ]]; then
    cp -a --reflink=auto "$base" "$run"
    cp /etc/resolv.conf "$run/etc/resolv.conf" 2>/dev/null || true
    say "cloning ${rev:0:12} from $repo into $home/zinf"
    git clone -q --no-hardlinks "$repo" "$run$home/zinf" || die 70 "git clone of $repo failed"
    git -C "$run$home/zinf" checkout -q --detach "$rev" || die 70 "checkout of $rev failed"
    [[ $user == root ]] || chroot "$run" chown -R "$user:$user" "$home/zinf"
fi
cuda=''
if [[ -e /usr/local/cuda/bin/nvcc ]]; then
    cuda=$(readlink -f /usr/local/cuda)
    mkdir -p "$run$cuda"
    [[ $cuda == /usr/local/cuda ]] || ln -sfn "$cuda" "$run/usr/local/cuda"
fi

# --- the run: namespaces, mounts, the targets --------------------------------
# Inside `unshare`: mounts that die with the namespace, a PID namespace whose
# end kills whatever a test left running, and the root's own host name.
inner() {
    set -euo pipefail
    local r=$RUN
    hostname zinf-fresh
    # "/" of a machine is a mount point (unshare --propagation, for one,
    # changes its propagation): the root bound onto itself is one.
    mount --bind "$r" "$r"
    mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
    mount --rbind /sys "$r/sys" && mount -o remount,bind,ro "$r/sys" 2>/dev/null || true
    mount -t tmpfs -o mode=755,nosuid tmpfs "$r/dev"
    local d
    for d in null zero full random urandom tty; do
        touch "$r/dev/$d" && mount --bind "/dev/$d" "$r/dev/$d"
    done
    mkdir -p "$r/dev/pts" "$r/dev/shm"
    mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts "$r/dev/pts"
    ln -s pts/ptmx "$r/dev/ptmx"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/dev/shm"
    ln -s /proc/self/fd "$r/dev/fd"
    ln -s /proc/self/fd/0 "$r/dev/stdin"
    ln -s /proc/self/fd/1 "$r/dev/stdout"
    ln -s /proc/self/fd/2 "$r/dev/stderr"
    mount --bind "$CACHE/apt-archives" "$r/var/cache/apt/archives"
    if [[ -n $CUDA ]]; then
        mount --bind "$CUDA" "$r$CUDA" && mount -o remount,bind,ro "$r$CUDA"
    fi
    local t status=0 cmd what
    for t in $TARGETS; do
        cmd="cd ~/zinf && ulimit -l 8192 && make $t $MAKE_ARGS"
        what="make $t${MAKE_ARGS:+ $MAKE_ARGS}"
        [[ -z $COMMAND ]] || { cmd="cd ~/zinf && ulimit -l 8192 && $COMMAND"; what=$COMMAND; }
        printf '\n## fresh-check: %s (as %s, in %s)\n' "$what" "$USER_NAME" "$r" >&2
        SECONDS=0
        set +e
        if [[ $USER_NAME == root ]]; then
            timeout --kill-after=30 "${TIMEOUT_MIN}m" chroot "$r" /usr/bin/env -i HOME=/root USER=root LOGNAME=root \
                PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 TERM=dumb \
                bash -c "$cmd"
        else
            timeout --kill-after=30 "${TIMEOUT_MIN}m" chroot "$r" /usr/sbin/runuser -u "$USER_NAME" -- \
                /usr/bin/env -i HOME="/home/$USER_NAME" USER="$USER_NAME" LOGNAME="$USER_NAME" \
                PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games LANG=C.UTF-8 TERM=dumb \
                bash -c "$cmd"
        fi
        status=$?
        set -e
        printf '## fresh-check: %s: exit %d after %d s\n' "$what" "$status" "$SECONDS" >&2
        ((status == 0)) || return "$status"
    done
}
export -f inner
out=$cache/runs/$stamp.log
[[ -n $log ]] || log=$out
SECONDS=0
set +e
COMMAND=$command RUN=$run CACHE=$cache CUDA=$cuda TARGETS="${targets[*]}" MAKE_ARGS=$make_args USER_NAME=$user TIMEOUT_MIN=$timeout_min \
    unshare --mount --uts --pid --fork --propagation private bash -c inner 2>&1 </dev/null | tee "$log"
status=${PIPESTATUS[0]}
set -e
total=$SECONDS

# --- what a reader needs from the log ----------------------------------------
printf '\n# fresh-check of %s (%s) in a fresh Debian 12 root, as %s: %s, %d s in all\n' \
    "${rev:0:12}" "$(git -C "$repo" log -1 --format=%s "$rev" | cut -c1-60)" "$user" \
    "$( ((status == 0)) && echo passed || echo "FAILED (exit $status)")" "$total" >&2
grep -E '^## fresh-check: .*: exit [0-9]+ after' "$log" | sed 's/^## /#   /' >&2 || true
tally=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
[[ -z $tally ]] || printf '#   make test: %s\n' "$tally" >&2
skips=$(grep -E '^(skip - |# .*: skipped)' "$log" | sed 's/^/#     /' || true)
[[ -z $skips ]] || printf '#   skipped, with the reasons:\n%s\n' "$skips" >&2
printf '#   log: %s\n' "$log" >&2
exit "$status"
