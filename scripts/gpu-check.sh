#!/usr/bin/env bash
# The GPU acceptance check in two commands, for GPU hosts without network and
# without our Debian packages (man/zinf-gpu-check.7).
#
#   scripts/gpu-check.sh --bundle DIR
#       On a Debian 12 machine with network: downloads the Debian packages zinf
#       builds with (apt-get download, never installed), unpacks them, prunes
#       them (no docs; of Boost only the headers Boost.Test needs) and packs
#       DIR/deps.tar.xz with DIR/MANIFEST (each package, its version, the
#       archive's sha256). Fails when DIR is over 60 MiB.
#   scripts/gpu-check.sh --from DIR --out RESULTS [--quick] [--budget SECONDS]
#       On the GPU host: unpacks DIR into build/gpu-deps (never system-wide),
#       says what the host has, builds with every core against it (with the
#       host's Open MPI if any, else NO_MPI=1),
#       then runs the GPU tests (build/tests/test_cuda, tests/e2e/cuda.sh), a
#       quick set of CPU unit suites and, unless --quick, the step profiles at
#       the sizes people train at (zinf-train --bench --profile: GPT-2 124M at
#       T 1024, B 4 and 16, fp32 and bf16; smollm-135m and llama-3.2-1b bf16
#       at T 1024), zinf-pinstress --device cuda, ZeRO-Infinity at a real
#       size (llama-3.2-1b and gpt2-1.5b in four placements at the batch
#       zinf-plan names: run_infinity), compute-sanitizer's memcheck and
#       racecheck over test_cuda and zinf-commbench --backend nccl. Writes RESULTS/log.txt (everything,
#       each profile's whole table), RESULTS/results.jsonl (one record per
#       step: name, status pass|fail|skip, seconds, reason, figures: a
#       profile's zinf.train-bench/1 and zinf.profile/1 records) and
#       RESULTS/summary.txt (a profile's line: model FLOP/s as a share of the
#       GEMM rate of the same run, its top rows, its GEMM against its own
#       shapes alone; a ZeRO-Infinity run's: tokens/s against all on the
#       GPU, the plan's step, the stalls). Every step has its own time limit inside the budget
#       (720 s, --quick 240 s); a step that cannot run is skipped with the
#       reason.
#   scripts/gpu-check.sh --help
#
# Options of --from: --quick (tests only), --budget SECONDS (the whole run;
# each step's limit scales with it, for slower machines),
# --infinity with|none|only (the ZeRO-Infinity runs with the rest, the
# default; none of them; or only them, with the llama1b profile and
# zinf-pinstress their plan reads: the check in two commands where one
# command may not run 12 minutes, e.g. --infinity none --budget 420, then
# --infinity only --budget 330, 13 minutes with the lease's start),
# --cpu-suites "test_util test_io ..." (the CPU unit suites; "none" for none),
# --jobs N (make -j; every core by default).
# Exit: 0 every step passed or was skipped and a GPU step ran; 1 a step
# failed (or the check stopped early: the summary says where); 3 no GPU: no
# step failed, but no GPU step ran (no GPU, or none of its steps could run),
# so the host is not shown to have a working GPU; 64 usage; 65 a corrupt
# bundle; 66 no bundle; 69 a tool the command needs is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/lib.bash
. "$root/scripts/lib.bash"

limit_mib=60
archive=deps.tar.xz
# The CPU unit suites --from runs by default: every module's suite that takes
# seconds on 16 cores (the slow ones, engine, optimizer and model, stay with
# `make test`); enough to see a broken host build.
default_cpu_suites="test_util test_io test_mem test_data test_optim test_device test_comm test_shard test_plan test_sample"

# --- --bundle ---------------------------------------------------------------
# The Debian 12 packages whose files the build needs. Not bundled:
# - OpenMPI: Open MPI's launcher, plugins and their dozen libraries do not
#   run from another prefix without care. The check builds with the host's
#   Open MPI where it has one (then tests/e2e/cuda.sh trains dp 2 on the GPU
#   under mpirun), else with NO_MPI=1; the mpirun suites run wherever
#   `make test` runs.
# - OpenBLAS: optional (the cpu backend's GEMM has its own OpenMP loop, the
#   reference the GPU is checked against either way), and 30 MiB with libgfortran.
bundle_packages() {
    echo liburing-dev liburing2 libxxhash-dev libxxhash0 librandom123-dev libcli11-dev nlohmann-json3-dev
    # Boost.Test by the versioned names the metapackage stands for (1.74 on Debian 12).
    local dev
    dev=$(apt-cache depends libboost-test-dev 2>/dev/null | awk '$1 == "Depends:" && !d { print $2; d = 1 }')
    [[ $dev =~ ^libboost-test([0-9.]+)-dev$ ]] || die 69 "apt-cache cannot resolve libboost-test-dev (is this Debian 12?)"
    local v=${BASH_REMATCH[1]}
    echo "$dev libboost-test$v.0 libboost$v-dev"
    # The text module (tokenizer.json): PCRE2's 8-bit library and utf8proc.
    # libpcre2-dev's links to its 16- and 32-bit and POSIX libraries dangle
    # in the stage; the build links -lpcre2-8 only.
    echo libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2
    # jq, for the end-to-end suites' JSON checks: GPU hosts seldom have it.
    echo jq libjq1 libonig5
}

# prune_boost STAGE: of STAGE/usr/include/boost keep what the unit tests
# include, followed with the compiler's -M, taken a library folder at a time
# (boost/mpl whole, boost/numeric/conversion whole), so another g++ version
# finding another path through Boost's configuration still finds its headers;
# and every top-level boost/*.hpp.
prune_boost() {
    local stage=$1 inc=$1/usr/include
    local probe=$work/boost-probe.cpp
    cat >"$probe" <<'EOF'
#define BOOST_TEST_DYN_LINK
#include <boost/test/unit_test.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/tools/floating_point_comparison.hpp>
#include <boost/test/tools/output_test_stream.hpp>
EOF
    local deps=$work/boost-deps f
    : >"$deps"
    for f in "$probe" "$root"/tests/unit/*.cpp; do
        # -MG: a header outside the bundle (cuda_runtime_api.h) is not an error.
        g++ -std=c++20 -DBOOST_TEST_DYN_LINK -I"$root/libzinf/include" -isystem "$inc" -M -MG -MT x "$f" >>"$deps" ||
            die 70 "g++ -M failed on $f"
    done
    local units
    units=$(tr -s ' \134' '\n' <"$deps" | grep "^$inc/boost/" | sed "s|^$inc/||" |
        awk -F/ 'NF == 3 { print $1 "/" $2 } NF > 3 { print $1 "/" $2 "/" $3 }' | sort -u)
    [[ -n $units ]] || die 70 "found no Boost headers through g++ -M"
    local kept=$work/boost-kept
    mkdir -p "$kept"
    local -a unit_list
    read -r -a unit_list <<<"$(tr '\n' ' ' <<<"$units")"
    (cd "$inc" && cp -a --parents "${unit_list[@]}" boost/*.hpp "$kept"/) || die 70 "cannot copy the Boost headers"
    rm -rf "$inc/boost"
    mv "$kept/boost" "$inc/boost"
    say "Boost: kept $(find "$inc/boost" -type f | wc -l) headers in $(wc -w <<<"$units") folders"
}

do_bundle() {
    local dir=$1
    local tool
    for tool in apt-get apt-cache dpkg-deb g++ tar xz sha256sum; do
        command -v "$tool" >/dev/null || die 69 "--bundle needs $tool (a Debian 12 machine with build-essential and xz-utils)"
    done
    [[ -r /etc/debian_version ]] || die 69 "--bundle runs on Debian 12 (no /etc/debian_version)"
    [[ $(cut -d. -f1 /etc/debian_version) == 12 ]] ||
        say "warning: Debian $(cat /etc/debian_version), not 12: the bundle is built from this release's packages"
    mkdir -p "$dir" || die 73 "cannot create $dir"
    work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle.XXXXXX")
    # shellcheck disable=SC2317  # called by the trap
    _remove_work() { rm -rf -- "$work"; }
    trap _remove_work EXIT
    local t0=$SECONDS
    local -a pkgs apt=(apt-get -q)
    read -r -a pkgs <<<"$(bundle_packages | tr '\n' ' ')"
    # As root apt downloads as _apt, who cannot write into our private folder.
    [[ $(id -u) == 0 ]] && apt+=(-o APT::Sandbox::User=root)
    mkdir "$work/debs"
    say "downloading ${#pkgs[@]} packages: ${pkgs[*]}"
    if ! (cd "$work/debs" && "${apt[@]}" download "${pkgs[@]}" >&2); then
        # Stale or missing package lists: refresh once when we may.
        [[ $(id -u) == 0 ]] || die 69 "apt-get download failed; an administrator may need to run apt-get update"
        if ! "${apt[@]}" update >&2 || ! (cd "$work/debs" && "${apt[@]}" download "${pkgs[@]}" >&2); then
            die 69 "apt-get download failed (no route to the Debian mirror?)"
        fi
    fi
    local stage=$work/stage deb
    mkdir "$stage"
    {
        echo "# zinf GPU-check bundle: Debian packages unpacked, pruned, packed in $archive"
        echo "format 1"
        echo "made $(date -u +%Y-%m-%dT%H:%M:%SZ) on Debian $(cat /etc/debian_version) $(dpkg --print-architecture)"
        echo "glibc-needs GLIBC_2.17 GLIBCXX_3.4.29 (libboost_unit_test_framework; Ubuntu 22.04 or newer)"
        echo "# package version sha256-of-the-.deb"
    } >"$work/MANIFEST"
    for deb in "$work"/debs/*.deb; do
        dpkg-deb -x "$deb" "$stage" || die 65 "cannot unpack $deb"
        printf 'package %s %s %s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)" \
            "$(sha256sum "$deb" | cut -d' ' -f1)" >>"$work/MANIFEST"
    done
    local before
    before=$(du -sm "$stage" | cut -f1)
    # Pruning: documentation, CMake files, static archives (every library is
    # linked shared, with a run path), the Boost libraries other than Boost.Test's.
    local lib
    lib=$(echo "$stage"/usr/lib/*-linux-gnu)
    [[ -d $lib ]] || die 65 "the packages have no usr/lib/<triplet> folder"
    find "$stage/usr/share" -mindepth 1 -maxdepth 1 ! -name pkgconfig -exec rm -rf {} +
    rm -rf "$lib/cmake"
    find "$lib" -name '*.a' -delete
    find "$lib" -name 'libboost_*' ! -name 'libboost_unit_test_framework*' -delete
    prune_boost "$stage"
    # pkg-config files that follow the prefix wherever it is unpacked.
    local pc
    for pc in "$lib"/pkgconfig/*.pc "$stage"/usr/share/pkgconfig/*.pc; do
        [[ -f $pc ]] || continue
        local up=../..
        [[ $pc == "$lib"/* ]] && up=../../..
        sed -i -e "s|^prefix=/usr\$|prefix=\${pcfiledir}/$up|" -e "s|=/usr/|=\${prefix}/|" "$pc"
    done
    # jq finds its libraries beside it through a wrapper (no patchelf needed).
    mkdir -p "$stage/usr/libexec/zinf"
    mv "$stage/usr/bin/jq" "$stage/usr/libexec/zinf/jq"
    cat >"$stage/usr/bin/jq" <<EOF
#!/bin/sh
# jq from the zinf GPU-check bundle, with its libraries from this prefix.
usr=\$(cd "\$(dirname "\$0")/.." && pwd)
LD_LIBRARY_PATH=\$usr/lib/$(basename "$lib")\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec "\$usr/libexec/zinf/jq" "\$@"
EOF
    chmod 755 "$stage/usr/bin/jq"
    "$stage/usr/bin/jq" -n '1' >/dev/null || die 70 "the bundled jq does not run"
    cp "$work/MANIFEST" "$stage/MANIFEST"
    local after
    after=$(du -sm "$stage" | cut -f1)
    say "unpacked ${before} MiB, ${after} MiB after pruning; compressing"
    tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . |
        xz -9 -T2 >"$work/$archive" || die 70 "cannot pack $archive"
    {
        echo "archive $archive $(stat -c %s "$work/$archive") $(sha256sum "$work/$archive" | cut -d' ' -f1)"
        echo "unpacked-mib $after"
    } >>"$work/MANIFEST"
    # Into DIR last, each file whole (a temporary name, then rename).
    local f
    for f in "$archive" MANIFEST; do
        { cp "$work/$f" "$dir/.$f.tmp" && mv "$dir/.$f.tmp" "$dir/$f"; } || die 73 "cannot write $dir/$f"
    done
    local bytes mib
    bytes=$(du -sb "$dir" | cut -f1)
    mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
    { grep '^package ' "$dir/MANIFEST" || true; } | awk '{ printf "  %-26s %s\n", $2, $3 }' >&2
    say "bundle $dir: $mib MiB ($bytes bytes) in $((SECONDS - t0)) s"
    ((bytes <= limit_mib * 1048576)) || die 1 "bundle $dir is $mib MiB, over the $limit_mib MiB limit"
    # The whole tree travels beside it: say when the two pass 64 MiB.
    if command -v git >/dev/null && git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
        local tree
        tree=$(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 -r du -cb 2>/dev/null | awk 'END { print $1 }')
        say "the tree (tracked and unignored files) is $(awk -v b="$tree" 'BEGIN { printf "%.1f", b / 1048576 }') MiB;" \
            "with the bundle $(awk -v b="$((tree + bytes))" 'BEGIN { printf "%.1f", b / 1048576 }') MiB of the 64 MiB a transfer takes"
    fi
}

# --- --from -----------------------------------------------------------------
now() { echo "${EPOCHREALTIME:-$SECONDS}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# json_string VAR TEXT: VAR set to TEXT as a JSON string, in the shell (no
# fork: a command substitution and a pipe through tr for each string were
# most of the CPU of a --quick run); json_str TEXT prints it.
json_string() {
    local -n _json=$1
    local s=$2
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\t'/\\t}
    s=${s//$'\r'/}
    s=${s//[$'\001'-$'\010'$'\013'$'\014'$'\016'-$'\037']/}  # (a bash string holds no NUL)
    _json="\"$s\""
}
json_str() {
    local j
    json_string j "$1"
    printf '%s' "$j"
}

n_pass=0 n_fail=0 n_skip=0 gpu_ran=0 summary_written=0
summary_rows=() profile_notes=() infinity_notes=()
# record NAME STATUS SECONDS REASON [FIGURES]: one line of results.jsonl and of
# the summary; FIGURES is a JSON object.
record() {
    local name=$1 status=$2 secs=$3 reason=$4 figures=${5:-} jname jreason
    json_string jname "$name"
    json_string jreason "$reason"
    {
        printf '{"schema":"zinf.gpu-check/1","name":%s,"status":"%s","seconds":%s,"reason":%s' \
            "$jname" "$status" "$secs" "$jreason"
        [[ -n $figures ]] && printf ',"figures":%s' "$figures"
        printf '}\n'
    } >>"$out/results.jsonl"
    case $status in
    pass)
        n_pass=$((n_pass + 1))
        [[ $name == gpu/* || $name == bench/* || $name == profile/* ]] && gpu_ran=1
        ;;
    fail) n_fail=$((n_fail + 1)) ;;
    skip) n_skip=$((n_skip + 1)) ;;
    esac
    summary_rows+=("$(printf '%-22s %-4s %6s  %s' "$name" "$status" "$secs" "${reason:0:120}")")
    printf '#### %s: %s (%s s)%s\n' "$name" "$status" "$secs" "${reason:+: $reason}"
}

# step_limit CAP: the seconds a step may take: CAP (for the default budget,
# scaled with --budget) or what the budget has left less the summary's
# reserve; false, with $no_time set, when that is under 15.
step_limit() {
    local cap=$(($1 * budget / default_budget)) left=$((deadline - SECONDS - 10))
    if ((left < 15)); then
        no_time="no time left: ${left} s of the ${budget} s budget remain"
        return 1
    fi
    limit=$((cap < left ? cap : left))
}

# run_timed LIMIT FILE CMD...: CMD under a timeout; its output to the log and
# FILE; sets rc and secs.
run_timed() {
    local lim=$1 file=$2 t0
    shift 2
    t0=$(now)
    echo "\$ $*"
    set +e
    timeout --kill-after=10 "$lim" "$@" </dev/null 2>&1 | tee "$file"
    rc=${PIPESTATUS[0]}
    set -e
    secs=$(elapsed "$t0")
}
# cpu_now: the CPU seconds (user and system) of every child waited for so
# far ("times" in this shell: a subshell's count starts at zero).
child_cpu() {
    times >"$tmp/times"
    cpu_now=$(tail -n 1 "$tmp/times" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); s += t[1] * 60 + t[2] } printf "%.0f", s }')
}
banner() { printf '\n######## %s (limit %s s; %s s into the run)\n' "$1" "$2" "$SECONDS"; }
timed_out() { ((rc == 124 || rc == 137)); }

# The last "N passed, N failed[, N skipped]" line of scripts/run-tests.sh.
tally_figures() {
    local line tp tf ts
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1)
    [[ -n $line ]] || return 1
    read -r tp _ tf _ ts _ <<<"${line//,/}"
    ts=${ts:-0}
    printf '{"passed":%d,"failed":%d,"skipped":%d}' "$tp" "$tf" "$ts"
}

# run_suites NAME CAP BINARY...: Boost.Test binaries through scripts/run-tests.sh.
run_suites() {
    local name=$1 cap=$2
    shift 2
    step_limit "$cap" || { record "$name" skip 0 "$no_time"; return 0; }
    banner "$name" "$limit"
    local figs=$tmp/${name//\//-}.out
    run_timed "$limit" "$figs" env ZINF_UNIT_TESTS="$*" ZINF_MPI_TESTS= ZINF_E2E=0 ZINF_TEST_JOBS=1 \
        ZINF_UNIT_TIMEOUT="$limit" "$root/scripts/run-tests.sh"
    local fig reason
    fig=$(tally_figures "$figs") || fig=
    reason=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$figs" | tail -n 1 || true)
    if timed_out; then
        record "$name" fail "$secs" "timed out after $limit s${reason:+; $reason}" "$fig"
    elif ((rc == 0)) && [[ -n $fig ]]; then
        record "$name" pass "$secs" "$reason" "$fig"
    else
        local failed
        failed=$(grep '^# failed: ' "$figs" | tail -n 1 | cut -c3- || true)
        record "$name" fail "$secs" "exit $rc; ${reason:-no tally}${failed:+; $failed}" "$fig"
    fi
}

# xml_attr NAME FILE: an attribute of the first <TestSuite> of a Boost XML report.
xml_attr() { grep -o "<TestSuite [^>]*>" "$2" | head -n 1 | grep -o " $1=\"[0-9]*\"" | grep -o '[0-9]\+' || echo 0; }

# run_boost NAME CAP BINARY: one Boost.Test suite, every case named in the
# log as it runs (a GPU run is rare: the log should say what ran), its counts
# from the XML report.
run_boost() {
    local name=$1 cap=$2 bin=$3
    step_limit "$cap" || { record "$name" skip 0 "$no_time"; return 0; }
    banner "$name" "$limit"
    local f=$tmp/${name//\//-}.out xml=$tmp/${name//\//-}.xml
    run_timed "$limit" "$f" "$bin" --color_output=no --log_level=test_suite \
        --report_format=XML --report_level=detailed --report_sink="$xml"
    local p=0 f_=0 s=0 a=0 fig=
    if [[ -s $xml ]] && grep -q "<TestSuite" "$xml"; then
        p=$(xml_attr test_cases_passed "$xml") f_=$(xml_attr test_cases_failed "$xml")
        s=$(xml_attr test_cases_skipped "$xml") a=$(xml_attr test_cases_aborted "$xml")
        f_=$((f_ + a))
        fig="{\"passed\":$p,\"failed\":$f_,\"skipped\":$s}"
    fi
    local failed
    failed=$(grep -o '<TestCase name="[^"]*" result="\(failed\|aborted\)"' "$xml" 2>/dev/null | cut -d'"' -f2 | head -n 5 | tr '\n' ' ' || true)
    if timed_out; then
        record "$name" fail "$secs" "timed out after $limit s" "$fig"
    elif [[ -z $fig ]]; then
        record "$name" fail "$secs" "exit $rc without a report (a crash?): $(tail -n 2 "$f" | tr '\n' ' ')"
    elif ((rc != 0 || f_ > 0)); then
        record "$name" fail "$secs" "$p passed, $f_ failed, $s skipped (exit $rc)${failed:+; failed: $failed}" "$fig"
    else
        record "$name" pass "$secs" "$p passed, $f_ failed, $s skipped" "$fig"
    fi
}

# have_option PROGRAM OPTION: PROGRAM's --help names OPTION.
have_option() { [[ -x $1 ]] && "$1" --help 2>&1 | grep -q -- "$2"; }

# The benchmarks: a program run with its figures (JSON records when it
# prints them) kept; a refusal (64) is a skip with the program's words.
run_bench() {
    local name=$1 cap=$2
    shift 2
    step_limit "$cap" || { record "$name" skip 0 "$no_time"; return 0; }
    banner "$name" "$limit"
    local f=$tmp/${name//\//-}.out
    run_timed "$limit" "$f" "$@"
    # The program's JSON records as figures, when jq finds them valid.
    local records fig=
    records=$(grep '^{' "$f" | paste -sd, - || true)
    if [[ -n $records ]] && command -v jq >/dev/null && printf '[%s]' "$records" | jq -e . >/dev/null 2>&1; then
        fig="{\"records\":[$records]}"
    fi
    if timed_out; then
        record "$name" fail "$secs" "timed out after $limit s" "$fig"
    elif ((rc == 64)); then
        record "$name" skip "$secs" "the program refused (exit 64): $(grep -v '^{' "$f" | grep -v '^#' | tail -n 2 | tr '\n' ' ')"
    elif ((rc == 0)); then
        record "$name" pass "$secs" "$(grep -v '^{' "$f" | grep -c . || true) lines of output" "$fig"
    else
        record "$name" fail "$secs" "exit $rc: $(tail -n 2 "$f" | tr '\n' ' ')" "$fig"
    fi
}

# run_profile NAME CAP ARGS...: zinf-train --device cuda --bench --profile
# --json ARGS as a benchmark step (run_bench), and its line for the summary
# (scripts/profile-summary.jq over its records).
run_profile() {
    local name=$1 cap=$2
    shift 2
    run_bench "$name" "$cap" "$root/bin/zinf-train" --device cuda --bench --profile --json "$@"
    local f=$tmp/${name//\//-}.out line
    [[ $rc == 0 && -s $f ]] || return 0
    if line=$(grep '^{' "$f" | jq -r -s -f "$root/scripts/profile-summary.jq" 2>&1); then
        # The cuBLASLt epilogues it could not use (the GEMM and a separate
        # kernel ran instead: said once a shape on stderr, in log.txt).
        local stand_ins
        stand_ins=$(grep -c 'epilogue for a GEMM of' "$f" || true)
        ((stand_ins > 0)) && line+=" | $stand_ins epilogue stand-ins (log.txt)"
        profile_notes+=("$(printf '%-22s %s' "${name#profile/}" "$line")")
    else
        profile_notes+=("$(printf '%-22s %s' "${name#profile/}" "(no summary: $line)")")
    fi
}

# The step profiles at the sizes people train at, before everything else
# that is optional (the sanitizers, the other benchmarks): each is a short
# --bench (a warm-up and two timed steps) with the device's peaks, every
# kernel timed, and its costliest GEMM shapes timed alone. Sized from the
# first H200 run (2026-11-26: GPT-2 124M fp32 at B 4, T 1024 took 0.50 s a
# step): a run is about 5 s of start-up (CUDA, cuBLASLt, 124M parameters
# made on the host, the peaks) and three steps, GPT-2 at B 16 about 2 s a
# step today, llama-3.2-1b (1.24 B parameters, 16 layers) about 6 s a step
# and 10 s to make its parameters: the caps below (190 s in all) leave each
# run twice that, and a faster backend only shortens them.
profile_names="profile/gpt2-fp32-b4 profile/gpt2-fp32-b16 profile/gpt2-bf16-b4 profile/gpt2-bf16-b16 profile/smollm-bf16 profile/llama1b-bf16"
run_profiles() {
    local s
    if [[ -z $gpu ]]; then
        for s in $profile_names; do record "$s" skip 0 "$no_gpu"; done
        return 0
    fi
    if ! have_option "$root/bin/zinf-train" --profile; then
        for s in $profile_names; do record "$s" skip 0 "zinf-train has no --profile option (its --help names none)"; done
        return 0
    fi
    if ! command -v jq >/dev/null; then
        say "no jq: the profiles run, but summary.txt gets no line of theirs"
    fi
    local t=(--seq 1024 --bench-steps 2)
    if [[ $infinity == only ]]; then  # the GEMM rate the ZeRO-Infinity plan reads
        for s in $profile_names; do [[ $s == profile/llama1b-bf16 ]] || record "$s" skip 0 "--infinity only"; done
        run_profile profile/llama1b-bf16 45 --bench-model llama-3.2-1b --batch 4 --precision bf16 "${t[@]}"
        return 0
    fi
    run_profile profile/gpt2-fp32-b4 30 --bench-model gpt2-124m --batch 4 "${t[@]}"
    run_profile profile/gpt2-fp32-b16 35 --bench-model gpt2-124m --batch 16 "${t[@]}"
    run_profile profile/gpt2-bf16-b4 25 --bench-model gpt2-124m --batch 4 --precision bf16 "${t[@]}"
    run_profile profile/gpt2-bf16-b16 30 --bench-model gpt2-124m --batch 16 --precision bf16 "${t[@]}"
    run_profile profile/smollm-bf16 25 --bench-model smollm-135m --batch 4 --precision bf16 "${t[@]}"
    run_profile profile/llama1b-bf16 45 --bench-model llama-3.2-1b --batch 4 --precision bf16 "${t[@]}"
}

# ZeRO-Infinity at a real size (issue 44): llama-3.2-1b and gpt2-1.5b,
# bf16, T 1024, at the batch zinf-plan names (the offload_batch of
# param=cpu,optim=cpu: the first batch at which its predicted step is within
# 10% of all on the GPU's, from this run's own figures: the llama1b
# profile's GEMM rate, bench/pinstress's host <-> device copies and
# bench/nvmebench's disk), kept within 4..16 so that a step stays a few
# seconds; in four placements, each run training on from the one before on
# the same state:
#   gpu       parameters and optimizer state on the GPU (the device's AdamW)
#   optim-cpu parameters on the GPU, the optimizer state on the CPU
#   cpu       both on the CPU, --device-memory 1 GiB past what the run needs
#             at least (zinf-train's refusal names it: far below the model)
#   nvme      both on NVMe, the state in two generations on this disk
# Each run: 3 steps (the first records the fetch order; the medians of the
# other two are the figures), its tokens/s beside the gpu run's, zinf-plan's
# step for the placement at that batch, and the step record's stalls
# (h2d_stall_s, d2h_stall_s) and the optimizer's host and hidden seconds,
# one line each in summary.txt.
# Time: the state is made once per model (zinf-shard init: 17 GB for
# llama-3.2-1b, 22 GB for gpt2-1.5b, about 15 s on the first H200 host's
# disk) and re-tiered for the next placement by rewriting the manifest's
# tiers with jq (the layout's offsets and files do not depend on the tier:
# tests/e2e/gpucheck.sh checks it), not written again; it is removed
# before the next model so that two generations of the larger one fit the
# 64 GiB disk. A step at B 8 is about 1-3 s of compute on the H200 and the
# nvme step about 40 GB of disk traffic (10-15 s): caps of 40 s a state and
# 45 s a run (the nvme run 75 s), 430 s at most for both models, 250 s
# expected. With the budget's 720 s (startup and the copies to and from the
# host take 1-2 minutes more: 15 minutes of device time in all) the steps
# after these (the sanitizers, commbench) get what is left and are skipped
# with the reason when nothing is; --budget 900 runs them too.
# (ZINF_GPU_CHECK_MODELS and ZINF_GPU_CHECK_DEVICE replace the models and
# --device cuda, to try these steps' host side with tiny models on the cpu
# backend.)
infinity_models=${ZINF_GPU_CHECK_MODELS:-llama-3.2-1b gpt2-1.5b}
infinity_device=${ZINF_GPU_CHECK_DEVICE:-cuda}
infinity_placements="gpu optim-cpu cpu nvme"
infinity_names() {
    local m p
    for m in $infinity_models; do for p in $infinity_placements; do echo "infinity/$m-$p"; done; done
}
# retier MANIFEST PARAM OPTIM: the same state under other tiers.
retier() {
    jq -c --arg p "$2" --arg o "$3" \
        'if has("schema") then .param_tier = $p | .optim_tier = $o | .grad_tier = $o
         else .tier = (if .state == "param" then $p else $o end) end' "$1" >"$1.new" && mv "$1.new" "$1"
}
tiers_of() { # PLACEMENT -> "PARAM OPTIM"
    case $1 in gpu) echo "gpu gpu" ;; optim-cpu) echo "gpu cpu" ;; cpu) echo "cpu cpu" ;; nvme) echo "nvme nvme" ;; esac
}
run_infinity() {
    local s m
    if [[ -z $gpu ]]; then
        for s in $(infinity_names); do record "$s" skip 0 "$no_gpu"; done
        return 0
    fi
    local why=
    [[ -x $root/bin/zinf-shard && -x $root/bin/zinf-plan && -x $root/bin/zinf-nvmebench ]] ||
        why="zinf-shard, zinf-plan or zinf-nvmebench was not built"
    [[ -z $why ]] && ! have_option "$root/bin/zinf-train" --device-memory && why="zinf-train's --help names no --device-memory"
    [[ -z $why ]] && ! command -v jq >/dev/null && why="no jq (the runs' records are read with it)"
    if [[ -n $why ]]; then
        for s in $(infinity_names); do record "$s" skip 0 "$why"; done
        return 0
    fi
    local work=$root/build/gpu-check-state
    rm -rf -- "$work"
    mkdir -p "$work"
    # The plan's inputs: the GEMM rate (the llama profile's step record),
    # the host <-> device copies (bench/pinstress), the disk.
    run_bench bench/nvmebench 30 "$root/bin/zinf-nvmebench" --dir "$work" --size 1GiB -b 1MiB -d 32 -Q 2 --best -q
    local best=$tmp/bench-nvmebench.out records=$work/gpu-records.jsonl
    grep -h '^{' "$tmp/profile-llama1b-bf16.out" "$tmp/bench-pinstress.out" 2>/dev/null >"$records" || true
    local rd wr
    rd=$(grep '^{' "$best" 2>/dev/null | jq -s '.[-1].read_gibps * 1.073741824 // empty' 2>/dev/null || true)
    wr=$(grep '^{' "$best" 2>/dev/null | jq -s '.[-1].write_gibps * 1.073741824 // empty' 2>/dev/null || true)
    local cfg=() disk=()
    if [[ -n $rd && -n $wr ]]; then
        grep '^{' "$best" | tail -n 1 >"$work/best.json"
        cfg=(--config "$work/best.json")
        disk=(--bw-nvme-read "$rd" --bw-nvme-write "$wr")
    fi
    local text=$work/text.txt
    cat "$root"/docs/*.md "$root"/README.md >"$text"
    for m in $infinity_models; do infinity_model "$m"; done
    rm -rf -- "$work"
}
# infinity_model MODEL: its state, its batch from the plan, the four runs.
infinity_model() {
    local m=$1 state=$work/$1 p
    local names=()
    for p in $infinity_placements; do names+=("infinity/$m-$p"); done
    step_limit 40 || { for s in "${names[@]}"; do record "$s" skip 0 "$no_time"; done; return 0; }
    banner "infinity/$m state" "$limit"
    run_timed "$limit" "$tmp/init-$m.out" bash -c '"$1" layout --model "$2" --param gpu --optim gpu | "$3" init --dir "$4" >/dev/null' \
        _ "$root/bin/zinf-shard" "$m" "$root/bin/zinf-shard" "$state"
    if ((rc != 0)); then
        for s in "${names[@]}"; do record "$s" fail "$secs" "zinf-shard init of $m: exit $rc: $(tail -n 1 "$tmp/init-$m.out")"; done
        rm -rf -- "$state"
        return 0
    fi
    local plan=(--model "$m" --seq 1024 --param-dtype bf16 --grad-dtype fp32 --bench "$records" "${disk[@]}" --json)
    local b
    b=$("$root/bin/zinf-plan" "${plan[@]}" --batch 1 2>/dev/null |
        jq -r '.placements[] | select(.placement == "param=cpu,optim=cpu") | .offload_batch // empty' || true)
    local named=${b:-none}
    [[ $b =~ ^[0-9]+$ ]] || b=8
    ((b < 4)) && b=4
    ((b > 16)) && b=16
    "$root/bin/zinf-plan" "${plan[@]}" --batch "$b" >"$work/plan-$m.json" 2>/dev/null || true
    local gpu_tps='' step=0
    for p in $infinity_placements; do
        local name=infinity/$m-$p tiers
        read -r -a tiers <<<"$(tiers_of "$p")"
        retier "$state/manifest.jsonl" "${tiers[0]}" "${tiers[1]}"
        step=$((step + 3))
        local args=(--device "$infinity_device" --manifest "$state/manifest.jsonl" --text "$text" --resume --steps "$step"
            --batch "$b" --seq 1024 --precision bf16 --lr 1e-4 --pinned 2GiB --json "${cfg[@]}")
        if [[ $p == cpu ]]; then
            # What the run needs at least, from its refusal of a budget too small.
            local need
            need=$("$root/bin/zinf-train" "${args[@]}" --device-memory 64MiB 2>&1 >/dev/null |
                grep -o 'at least [0-9]* bytes' | head -n 1 | grep -o '[0-9]*' || true)
            if [[ -z $need ]]; then
                record "$name" fail 0 "zinf-train did not name the device memory it needs at least"
                step=$((step - 3))
                continue
            fi
            args+=(--device-memory "$((need + 1073741824))")
        fi
        local cap=45
        [[ $p == nvme ]] && cap=75
        step_limit "$cap" || { record "$name" skip 0 "$no_time"; step=$((step - 3)); continue; }
        banner "$name" "$limit"
        local f=$tmp/${name//\//-}.out
        run_timed "$limit" "$f" "$root/bin/zinf-train" "${args[@]}"
        if timed_out || ((rc != 0)); then
            record "$name" fail "$secs" "$(timed_out && echo "timed out after $limit s" || echo "exit $rc"): $(grep -v '^{' "$f" | tail -n 1)"
            # The state is where the failed run left it: the next placement starts from its manifest.
            step=$(jq -r 'select(has("schema") | not) | .step' "$state/manifest.jsonl" 2>/dev/null | head -n 1 || echo "$step")
            continue
        fi
        local fig
        fig=$(grep '^{' "$f" | jq -s -c --arg p "$p" --argjson b "$b" --slurpfile plan "$work/plan-$m.json" \
            --arg tiers "param=${tiers[0]},optim=${tiers[1]}" '
            def med(k): map(k) | sort | .[length / 2 | floor];
            (map(select(.schema == "zinf.train/1")) | sort_by(.step)) as $all
            | (if ($all | length) > 1 then $all[1:] else $all end) as $t
            | {placement: $p, batch: $b, steps: ($t | length),
               tokens_per_s: ($t | med(.tokens_per_s)), step_s: ($t | med(.step_s)),
               h2d_stall_s: ($t | med(.h2d_stall_s // 0)), d2h_stall_s: ($t | med(.d2h_stall_s // 0)),
               h2d_gbps: ($t | med(.h2d_gbps // 0)), d2h_gbps: ($t | med(.d2h_gbps // 0)),
               optimizer_host_s: ($t | med(.optimizer_host_s // 0)), optimizer_hidden_s: ($t | med(.optimizer_hidden_s // 0)),
               step_floor_ratio: ($t | med(.step_floor_ratio // 0)),
               plan_step_s: (($plan[0].placements // [])[] | select(.placement == $tiers) | .step_s)}' 2>/dev/null || true)
        if [[ -z $fig ]]; then
            record "$name" fail "$secs" "no step records in its output"
            continue
        fi
        local tps
        tps=$(jq -r '.tokens_per_s' <<<"$fig")
        [[ $p == gpu ]] && gpu_tps=$tps
        record "$name" pass "$secs" "batch $b (plan: $named), $(printf '%.0f' "$tps") tokens/s" "$fig"
        infinity_notes+=("$(jq -r --arg n "$m $p" --arg g "${gpu_tps:-}" '
            def r(d): . * d | round / d;
            "\($n | .[0:22] | . + " " * (22 - length)) B \(.batch) \(.tokens_per_s | round) tok/s"
            + (if $g != "" then " (\(.tokens_per_s / ($g | tonumber) | r(100))x gpu)" else "" end)
            + " step \(.step_s | r(1000)) s, plan \(if .plan_step_s == null then "unknown" else (.plan_step_s | r(1000) | tostring) + " s" end)"
            + " | stall h2d \(.h2d_stall_s | r(1000)) d2h \(.d2h_stall_s | r(1000)) s | optimizer host \(.optimizer_host_s | r(1000)) hidden \(.optimizer_hidden_s | r(1000)) s"' <<<"$fig")")
    done
    rm -rf -- "$state"
}

# compute-sanitizer TOOL over test_cuda.
run_sanitizer() {
    local tool=$1 cap=$2 name=gpu/$1
    [[ -n $gpu ]] || { record "$name" skip 0 "$no_gpu"; return 0; }
    [[ -x $root/build/tests/test_cuda ]] || { record "$name" skip 0 "no build/tests/test_cuda (the build made none)"; return 0; }
    [[ -n $sanitizer ]] || { record "$name" skip 0 "no compute-sanitizer on PATH or in $cuda_home"; return 0; }
    step_limit "$cap" || { record "$name" skip 0 "$no_time"; return 0; }
    banner "$name" "$limit"
    local f=$tmp/$tool.out
    # The GEMM rates are not measured under a sanitizer (it slows every
    # kernel), nor NCCL's collectives (its own kernels are not zinf's code).
    run_timed "$limit" "$f" "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 20 \
        "$root/build/tests/test_cuda" --color_output=no --log_level=warning \
        --run_test='!gemm_rates_are_measured,nccl_collectives_enqueued_on_a_device_stream,nccl_buckets_lay_flat_in_the_callers_area'
    local summary ours
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -n 1 | sed 's/^=* *//' || true)
    # racecheck reports hazards inside cuBLASLt's own GEMM kernels (nvjet_*,
    # seen on an H200, 2026-11-26): not zinf's code, counted apart.
    ours=$(grep -E 'Error: Race reported' "$f" | grep -cvE 'nvjet|cublas' || true)
    if [[ $tool == racecheck ]] && ((rc == 99)) && ((ours == 0)) && ! grep -q 'failures\? \(is\|are\) detected' "$f"; then
        record "$name" pass "$secs" "no hazard in zinf's kernels; ${summary:-?} all inside cuBLASLt's own kernels"
    elif timed_out; then
        record "$name" fail "$secs" "timed out after $limit s (the suite is too slow under $tool in this budget)"
    elif ((rc == 0)); then
        record "$name" pass "$secs" "${summary:-no errors}"
    elif ((rc == 99)); then
        record "$name" fail "$secs" "$tool found errors: ${summary:-see log.txt}"
    else
        record "$name" fail "$secs" "exit $rc (a test failed under $tool)${summary:+; $summary}"
    fi
}

# unpack_bundle DIR: checks DIR's archive against its MANIFEST, unpacks it
# into $prefix. Exits 66 (missing) or 65 (corrupt) after recording why.
unpack_bundle() {
    local dir=$1 t0
    t0=$(now)
    local bad=
    if [[ ! -d $dir ]]; then
        bad="66 no bundle folder $dir (make one with: scripts/gpu-check.sh --bundle $dir)"
    elif [[ ! -f $dir/MANIFEST || ! -f $dir/$archive ]]; then
        bad="66 $dir has no MANIFEST and $archive (make one with: scripts/gpu-check.sh --bundle $dir)"
    else
        local want got
        want=$(awk -v a="$archive" '$1 == "archive" && $2 == a { print $4 }' "$dir/MANIFEST")
        got=$(sha256sum "$dir/$archive" | cut -d' ' -f1)
        if [[ -z $want ]]; then
            bad="65 $dir/MANIFEST names no checksum for $archive: a corrupt or unfinished bundle"
        elif [[ $want != "$got" ]]; then
            bad="65 $dir/$archive is corrupt: sha256 $got, the MANIFEST says $want"
        fi
    fi
    if [[ -z $bad ]]; then
        rm -rf "$prefix"
        mkdir -p "$prefix"
        local how
        if command -v xz >/dev/null; then
            how="tar and xz"
            tar -C "$prefix" -xJf "$dir/$archive" || bad="65 $dir/$archive does not unpack (tar -xJf failed)"
        elif command -v python3 >/dev/null; then
            how="python3's tarfile (no xz here)"
            python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$dir/$archive" "$prefix" ||
                bad="65 $dir/$archive does not unpack (python3 tarfile failed)"
        else
            bad="69 cannot unpack $archive: neither xz nor python3 on this host"
        fi
    fi
    if [[ -n $bad ]]; then
        record bundle fail "$(elapsed "$t0")" "${bad#* }"
        finish_run
        close_log
        exit "${bad%% *}"
    fi
    local n
    n=$(grep -c '^package ' "$dir/MANIFEST" || true)
    record bundle pass "$(elapsed "$t0")" "$n packages unpacked with $how into $prefix" \
        "{\"packages\":$n,\"bytes\":$(stat -c %s "$dir/$archive")}"
    # (grep finds no line in a MANIFEST that lists no package: not a failure)
    { grep '^package ' "$dir/MANIFEST" || true; } | awk '{ printf "  %-26s %s\n", $2, $3 }'
}

# What the host has. Sets gpu / no_gpu, nvcc, cuda_home, sanitizer, nccl_*.
survey_host() {
    local t0 facts=() line l
    t0=$(now)
    banner host 10
    echo "os: $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"'), kernel $(uname -r), $(uname -m)"
    echo "cores: $(nproc), memory: $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
    echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null || echo unknown)"
    facts+=("\"cores\":$(nproc)")
    local problems=()
    # The compiler: g++, or where it is older than 12 (the version zinf is
    # built with on Debian 12) the newest g++-NN beside it.
    cxx=
    if command -v g++ >/dev/null; then
        cxx=g++
        local major v
        major=$(g++ -dumpversion | cut -d. -f1)
        if ((major < 12)); then
            for v in 15 14 13 12; do
                if command -v "g++-$v" >/dev/null; then
                    cxx=g++-$v
                    echo "g++ is version $major; using g++-$v"
                    break
                fi
            done
        fi
        line=$("$cxx" --version | head -n 1)
        echo "g++: $line ($cxx)"
        facts+=("\"gxx\":$(json_str "$line")")
    else
        echo "g++: MISSING"
        problems+=("no g++ (the build needs g++ 12 or newer, for C++20)")
    fi
    if command -v make >/dev/null; then
        echo "make: $(make --version | head -n 1)"
    else
        echo "make: MISSING"
        problems+=("no make")
    fi
    cuda_home=${CUDA_HOME:-}
    nvcc=$(command -v nvcc || true)
    [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
    if [[ -n $nvcc ]]; then
        [[ -z $cuda_home ]] && cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
        line=$("$nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*' || true)
        echo "nvcc: $nvcc ($line), toolkit $cuda_home"
        facts+=("\"nvcc\":$(json_str "$line")")
    else
        echo "nvcc: not found (nor /usr/local/cuda/bin/nvcc): the cuda backend is not built"
        cuda_home=${cuda_home:-/usr/local/cuda}
    fi
    gpu=
    if ! command -v nvidia-smi >/dev/null; then
        no_gpu="no GPU: nvidia-smi is not on this host"
    elif ! line=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1) || [[ -z $line ]]; then
        no_gpu="no GPU: nvidia-smi answers: $(head -n 1 <<<"$line")"
    else
        gpu=$(head -n 1 <<<"$line")
        echo "GPUs ($(wc -l <<<"$line")):"
        while IFS= read -r l; do echo "  $l"; done <<<"$line"
        facts+=("\"gpu\":$(json_str "$gpu")" "\"gpus\":$(wc -l <<<"$line")")
        timeout 30 nvidia-smi 2>&1 | head -n 20 || true
    fi
    [[ -n $gpu ]] || echo "$no_gpu"
    sanitizer=$(command -v compute-sanitizer || true)
    local c
    for c in "$cuda_home"/bin/compute-sanitizer "$cuda_home"/compute-sanitizer/compute-sanitizer; do
        [[ -z $sanitizer && -x $c ]] && sanitizer=$c
    done
    echo "compute-sanitizer: ${sanitizer:-not found}"
    # NCCL: the toolkit's, else the nvidia-nccl wheel's (the build needs its
    # header, the programs dlopen its libnccl.so.2).
    nccl_header='' nccl_lib=''
    if [[ -f $cuda_home/include/nccl.h ]]; then
        nccl_header=$cuda_home/include/nccl.h
        nccl_lib=$cuda_home/lib64
    elif command -v python3 >/dev/null; then
        local wheel
        wheel=$(timeout 30 python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
        if [[ -n $wheel && -f $wheel/include/nccl.h ]]; then
            nccl_header=$wheel/include/nccl.h
            nccl_lib=$wheel/lib
        fi
    fi
    echo "NCCL: ${nccl_header:-not found (neither in $cuda_home/include nor in a python nvidia-nccl wheel)}"
    echo "python3: $(command -v python3 >/dev/null && python3 --version 2>&1 || echo none)"
    echo "jq: $(command -v jq || echo none)"
    if ((${#problems[@]})); then
        record host fail "$(elapsed "$t0")" "${problems[*]}" "{$(IFS=,; echo "${facts[*]}")}"
        return 1
    fi
    record host pass "$(elapsed "$t0")" "${gpu:-$no_gpu}; $([[ -n $nvcc ]] && echo "nvcc $cuda_home" || echo "no nvcc"); $([[ -n $nccl_header ]] && echo NCCL || echo "no NCCL")" \
        "{$(IFS=,; echo "${facts[*]}")}"
}

build() {
    local cap=$1
    step_limit "$cap" || { record build skip 0 "$no_time"; return 1; }
    banner build "$limit"
    local args=("DEPS_PREFIX=$prefix")
    # MPI is not bundled (see bundle_packages): the host's Open MPI where it
    # has one (mpicxx --showme, mpirun), for the dp 2 check in
    # tests/e2e/cuda.sh; else NO_MPI=1, and that check is skipped.
    if command -v mpirun >/dev/null && mpicxx --showme:compile >/dev/null 2>&1; then
        echo "MPI: the host's $(command -v mpicxx) (dp 2 on the GPU runs under mpirun)"
    else
        args+=(NO_MPI=1)
    fi
    [[ $cxx == g++ ]] || args+=("CXX=$cxx")
    # One compiler for every file: a clang on the host is of a version
    # nobody here built with (the Makefile would take it for the tests).
    args+=("FAST_CXX=$cxx")
    # NCCL from the python wheel: its header for the build (the Makefile's
    # NCCL_H, CPATH for the compiler).
    if [[ -n $nccl_header && $nccl_header != "$cuda_home"/include/nccl.h ]]; then
        args+=("NCCL_H=$nccl_header")
        export CPATH=${nccl_header%/nccl.h}${CPATH:+:$CPATH}
    fi
    [[ -n $nvcc ]] && args+=("CUDA_HOME=$cuda_home")
    # The unit suites this build makes: the Makefile's own list (a suite it
    # leaves out, test_cuda without a toolkit say, is not asked for).
    local tests=() t
    read -r -a tests <<<"$(make -C "$root" --no-print-directory -pq "${args[@]}" 2>/dev/null | sed -n 's/^TESTS := //p' | head -n 1)"
    if ((${#tests[@]} == 0)); then
        for t in "$root"/tests/unit/test_*.cpp; do
            t=${t##*/}
            tests+=("build/tests/${t%.cpp}")
        done
    fi
    # Not the mpirun suites: they run with `make test`, not in this budget.
    local keep=()
    for t in "${tests[@]}"; do [[ $t == */mpi_* ]] || keep+=("$t"); done
    tests=("${keep[@]}")
    # -k: what builds is still tested when one file fails.
    local cpu0
    child_cpu
    cpu0=$cpu_now
    run_timed "$limit" "$tmp/build.out" make -C "$root" --no-print-directory -k -j"$jobs" "${args[@]}" all "${tests[@]}"
    local built=0
    for t in "${tests[@]}"; do [[ -x $root/$t ]] && built=$((built + 1)); done
    local progs
    progs=$(find "$root/bin" -maxdepth 1 -name 'zinf-*' -type f 2>/dev/null | wc -l)
    child_cpu
    local cpu=$((cpu_now - cpu0))
    local fig="{\"jobs\":$jobs,\"cpu_seconds\":$cpu,\"unit_suites\":$built,\"programs\":$progs}"
    if timed_out; then
        record build fail "$secs" "timed out after $limit s with -j$jobs ($built of ${#tests[@]} unit suites built)" "$fig"
    elif ((rc != 0)); then
        record build fail "$secs" "make exit $rc: $(grep -m 3 -E 'error|Error' "$tmp/build.out" | tr '\n' ' ' | cut -c1-300)" "$fig"
    else
        record build pass "$secs" "-j$jobs, $cpu CPU-seconds: $progs programs, $built unit suites; $(grep -E '^ +[✓✗] (nvcc|NCCL)' "$tmp/build.out" | sed 's/  */ /g' | tr '\n' ';')" "$fig"
    fi
}

# Back to the terminal, once tee has written the whole log.
close_log() {
    exec 1>&3 2>&4 3>&- 4>&-
    wait "$tee_pid" 2>/dev/null || true
}

# The verdict: FAIL when a step failed; else NO GPU when no GPU step ran
# (the host is not shown to have a working GPU: deploying on its PASS would
# be wrong); else PASS. Sets $verdict_status (1, 3, 0).
finish_run() {
    local verdict=PASS
    verdict_status=0
    if ((n_fail > 0)); then
        verdict=FAIL verdict_status=1
    elif ((!gpu_ran)); then
        verdict="NO GPU (${no_gpu:-no GPU step ran})" verdict_status=3
    fi
    summary_written=1
    {
        echo "# zinf GPU check $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)$( ((quick)) && echo ' (--quick)')"
        echo "# host: ${gpu:-${no_gpu:-GPU not surveyed}}"
        printf '# %-20s %-4s %6s  %s\n' step stat sec note
        printf '%s\n' "${summary_rows[@]}"
        if ((${#profile_notes[@]})); then
            echo "# step profiles (zinf-train --bench --profile; the tables in log.txt): time a step, model FLOP/s"
            echo "# as a share of the GEMM rate measured in the same run | the rows that took most of the step"
            echo "# | the GEMM's rate over its costliest shapes' timed alone"
            printf '%s\n' "${profile_notes[@]}"
        fi
        if ((${#infinity_notes[@]})); then
            echo "# ZeRO-Infinity (zinf-train --device cuda, bf16, T 1024, the medians of steps 2-3): tokens/s and"
            echo "# against all on the GPU | zinf-plan's step for the placement | the step record's stalls"
            printf '%s\n' "${infinity_notes[@]}"
        fi
        echo "# $n_pass passed, $n_fail failed, $n_skip skipped in $SECONDS s (budget $budget s): $verdict"
    } >"$out/summary.txt"
    echo
    cat "$out/summary.txt"
}

do_from() {
    local dir=$1
    out=$2
    mkdir -p "$out" || die 73 "cannot create $out"
    out=$(cd "$out" && pwd)
    rm -f "$out/log.txt" "$out/results.jsonl" "$out/summary.txt"
    exec 3>&1 4>&2
    exec > >(tee -a "$out/log.txt") 2>&1
    tee_pid=$!
    deadline=$((SECONDS + budget))
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
    # The summary is written whatever happens: a command that fails under
    # set -e (a step's own checks aside) ends the run as a failed step
    # naming the command, and the three files are there.
    # shellcheck disable=SC2317  # called by the traps
    _failed_at() { failed_at="line $1: $2 (exit $3)"; }
    set -E  # (the ERR trap in functions too)
    trap '_failed_at "$LINENO" "$BASH_COMMAND" "$?"' ERR
    # shellcheck disable=SC2317
    _end_run() {
        local rc=$?
        if ((!summary_written)); then
            record gpu-check fail 0 "the check stopped early at ${failed_at:-exit $rc}: a bug in gpu-check.sh"
            finish_run
            close_log
        fi
        rm -rf -- "$tmp"
        exit $((rc == 0 ? 1 : rc))
    }
    trap _end_run EXIT
    echo "# zinf GPU check: --from $dir --out $out$( ((quick)) && echo ' --quick'), budget $budget s, $(date -u)"
    echo "# tree $root at $(git -C "$root" log -1 --format='%h %s' 2>/dev/null || echo '(not a git checkout)')"
    prefix=$root/build/gpu-deps
    unpack_bundle "$dir"
    export PATH=$prefix/usr/bin:$PATH
    local host_ok=1
    survey_host || host_ok=0
    # The CUDA libraries (cuBLASLt, NCCL's dlopen) for every program run.
    export CUDA_HOME=$cuda_home
    export LD_LIBRARY_PATH=$cuda_home/lib64${nccl_lib:+:$nccl_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    if ((host_ok)); then
        build $((quick ? 170 : 200)) || true
    else
        record build skip 0 "the host cannot build: see the host step"
    fi

    # The GPU tests.
    local cuda_test=$root/build/tests/test_cuda ran_cuda_test=0
    if [[ $infinity == only ]]; then
        record gpu/test_cuda skip 0 "--infinity only"
    elif [[ ! -f $root/tests/unit/test_cuda.cpp ]]; then
        record gpu/test_cuda skip 0 "no tests/unit/test_cuda.cpp in this tree"
    elif [[ ! -x $cuda_test ]]; then
        record gpu/test_cuda fail 0 "tests/unit/test_cuda.cpp exists but the build made no build/tests/test_cuda"
    elif [[ -z $gpu ]]; then
        record gpu/test_cuda skip 0 "$no_gpu (the suite runs with the CPU suites, where its GPU cases skip themselves)"
    else
        run_boost gpu/test_cuda 120 "$cuda_test"
        ran_cuda_test=1
    fi
    if [[ $infinity == only ]]; then
        record gpu/e2e-cuda skip 0 "--infinity only"
    elif [[ ! -f $root/tests/e2e/cuda.sh ]]; then
        record gpu/e2e-cuda skip 0 "no tests/e2e/cuda.sh in this tree"
    elif [[ -z $gpu ]]; then
        record gpu/e2e-cuda skip 0 "$no_gpu"
    elif step_limit 120; then
        banner gpu/e2e-cuda "$limit"
        local f=$tmp/e2e-cuda.out line
        run_timed "$limit" "$f" bash "$root/tests/e2e/cuda.sh"
        line=$(grep '^# e2e-result ' "$f" | tail -n 1 || true)
        local p f_ s fig=
        if [[ -n $line ]]; then
            read -r _ _ p f_ s <<<"$line"
            fig="{\"passed\":$p,\"failed\":$f_,\"skipped\":$s}"
        fi
        if timed_out; then
            record gpu/e2e-cuda fail "$secs" "timed out after $limit s" "$fig"
        elif [[ -z $line ]]; then
            record gpu/e2e-cuda fail "$secs" "exit $rc without a '# e2e-result' line"
        elif ((rc != 0 || f_ > 0)); then
            record gpu/e2e-cuda fail "$secs" "$p passed, $f_ failed, $s skipped (exit $rc): $(grep '^FAIL' "$f" | head -n 3 | tr '\n' ' ')" "$fig"
        else
            record gpu/e2e-cuda pass "$secs" "$p passed, $f_ failed, $s skipped" "$fig"
        fi
    else
        record gpu/e2e-cuda skip 0 "$no_time"
    fi

    # The CPU suites: a quick set, so a broken host build shows.
    if [[ $cpu_suites == none || $infinity == only ]]; then
        record cpu/unit skip 0 "--cpu-suites none or --infinity only"
    else
        local suites=() s
        for s in $cpu_suites $( ((ran_cuda_test)) || echo test_cuda); do
            [[ -x $root/build/tests/$s ]] && suites+=("build/tests/$s")
        done
        if ((${#suites[@]} == 0)); then
            record cpu/unit fail 0 "none of the CPU unit suites was built ($cpu_suites)"
        else
            run_suites cpu/unit $((quick ? 60 : 90)) "${suites[@]}"
        fi
    fi

    if ((quick)); then
        local s
        for s in $profile_names $(infinity_names) gpu/memcheck gpu/racecheck bench/pinstress bench/commbench-nccl; do
            record "$s" skip 0 "--quick runs the tests only"
        done
    else
        run_profiles
        local pin=$root/bin/zinf-pinstress cb=$root/bin/zinf-commbench
        # (zinf-train --bench's fp32 and bf16 records, with activation_bytes
        # and device_peak_bytes, are the profiles' now, at T 1024.)
        # The host <-> device copies before ZeRO-Infinity, whose plan reads them.
        if [[ -z $gpu ]]; then
            record bench/pinstress skip 0 "$no_gpu"
        elif ! have_option "$pin" --device; then
            record bench/pinstress skip 0 "zinf-pinstress has no --device option (its --help names none)"
        else
            run_bench bench/pinstress 30 "$pin" --device cuda --seconds 5s --json
        fi
        if [[ $infinity == none ]]; then
            local s
            for s in $(infinity_names); do record "$s" skip 0 "--infinity none"; done
        else
            run_infinity
        fi
        if [[ $infinity == only ]]; then
            record gpu/memcheck skip 0 "--infinity only"
            record gpu/racecheck skip 0 "--infinity only"
        elif [[ -f $root/tests/unit/test_cuda.cpp ]]; then
            run_sanitizer memcheck 75
            run_sanitizer racecheck 75
        else
            record gpu/memcheck skip 0 "no tests/unit/test_cuda.cpp in this tree"
            record gpu/racecheck skip 0 "no tests/unit/test_cuda.cpp in this tree"
        fi
        if [[ $infinity == only ]]; then
            record bench/commbench-nccl skip 0 "--infinity only"
        elif [[ -z $gpu ]]; then
            record bench/commbench-nccl skip 0 "$no_gpu"
        else
            if ! have_option "$cb" nccl; then
                record bench/commbench-nccl skip 0 "zinf-commbench's --help names no nccl backend"
            else
                run_bench bench/commbench-nccl 40 "$cb" --backend nccl -b 1M -e 256M -f 4 --raw --json
            fi
        fi
    fi
    finish_run
    close_log
    trap - EXIT
    rm -rf -- "$tmp"
    return "$verdict_status"
}

# --- options ------------------------------------------------------------------
mode='' dir='' out='' quick=0 budget='' cpu_suites=$default_cpu_suites jobs=$(nproc) infinity=with
while (($#)); do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --bundle) need_value "$@"; mode=bundle dir=$2; shift ;;
    --from) need_value "$@"; mode=from dir=$2; shift ;;
    --out) need_value "$@"; out=$2; shift ;;
    --quick) quick=1 ;;
    --budget) need_value "$@"; budget=$2; shift ;;
    --cpu-suites) need_value "$@"; cpu_suites=$2; shift ;;
    --jobs) need_value "$@"; jobs=$2; shift ;;
    --infinity) need_value "$@"; infinity=$2; shift ;;
    *) usage_error "unknown argument '$1'" ;;
    esac
    shift
done
case $mode in
bundle)
    [[ -z $out ]] || usage_error "--out goes with --from"
    do_bundle "$dir"
    ;;
from)
    [[ -n $out ]] || usage_error "--from needs --out RESULTS"
    # 420 s of tests, sanitizers and benchmarks before the profiles came;
    # they add 190 s of caps and replace the two 60 s --bench rows: 480.
    default_budget=$((quick ? 240 : 720))
    budget=${budget:-$default_budget}
    [[ $budget =~ ^[0-9]+$ ]] || usage_error "--budget takes whole seconds"
    [[ $jobs =~ ^[1-9][0-9]*$ ]] || usage_error "--jobs takes a positive number"
    [[ $infinity =~ ^(with|none|only)$ ]] || usage_error "--infinity takes with, none or only"
    do_from "$dir" "$out"
    ;;
*) usage_error "say --bundle DIR or --from DIR --out RESULTS" ;;
esac
