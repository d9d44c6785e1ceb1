#!/usr/bin/env bash
# The house's include rule (docs/ARCHITECTURE.md, "Layers" and "Rules"),
# checked against the code: the layer table is read from the document itself,
# so the picture and the code cannot drift apart unseen.
#   - a library file of module M (libzinf/src/M/, libzinf/include/zinf/M.hpp)
#     includes only modules of M's layer or below, through <zinf/...> or a
#     private "../N/..." path; two modules of one layer never include each
#     other both ways;
#   - util includes nothing of ours but util;
#   - no library file includes a program's files;
#   - public headers keep CLI11 and nlohmann/json out (json_fwd.hpp is fine).
# Then the rule is shown to bite: a file of util made to include zero.hpp,
# and a table that puts a module under one it includes, must both be found.
source "$(dirname "$0")/lib.bash"
W=$(mktemp -d /var/tmp/zinf-e2e-layers-XXXXXX)
on_exit "rm -rf '$W'"
DOC=$ROOT/docs/ARCHITECTURE.md

# layers_of DOC: "module layer" lines from the table's rows "| N | a, b | ...".
layers_of() {
  awk -F'|' '/^\| *[0-9]+ *\|/ { n = $2 + 0; k = split($3, m, ","); for (i = 1; i <= k; i++) { gsub(/[ `]/, "", m[i]); if (m[i] != "") print m[i], n } }' "$1"
}
# module_of HEADER: the module a public header belongs to, in REPLY (no
# subshell: it runs for every include).
module_of() {
  case $1 in
  kernels | profile) REPLY=device ;;
  gpt | llama) REPLY=model ;;
  family) REPLY=shard ;;
  options) REPLY=cli ;;
  *) REPLY=$1 ;;
  esac
}
# violations TREE LAYERS: one line per include that breaks the rule, in
# TREE (a copy of libzinf/), with LAYERS from layers_of.
violations() {
  local tree=$1 layers=$2
  declare -A layer=()
  local m n
  while read -r m n; do layer[$m]=$n; done <"$layers"
  declare -A uses=()
  local f mod inc dep line
  while IFS= read -r line; do
    f=${line%%:*} line=${line#*:}
    case $f in
    "$tree"/src/*) mod=${f#"$tree"/src/} mod=${mod%%/*} ;;
    "$tree"/include/zinf/*) mod=${f##*/} && module_of "${mod%.*}" && mod=$REPLY ;;
    *) continue ;;
    esac
    [[ -n ${layer[$mod]:-} ]] || { echo "$f: module $mod is in no row of the layer table"; continue; }
    if [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\<zinf/([a-z_0-9]+)\.(hpp|def)\> ]]; then
      inc="<zinf/${BASH_REMATCH[1]}.${BASH_REMATCH[2]}>"
      module_of "${BASH_REMATCH[1]}" && dep=$REPLY
    elif [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]]; then
      inc=${BASH_REMATCH[1]}
      [[ $inc == *../* ]] || continue  # beside the file: its own module
      local abs
      abs=$(realpath -m "$(dirname "$f")/$inc")
      case $abs in
      "$tree"/src/*) dep=${abs#"$tree"/src/} dep=${dep%%/*} ;;
      "$tree"/include/zinf/*) dep=${abs##*/} && module_of "${dep%.*}" && dep=$REPLY ;;
      *)
        echo "$f: includes \"$inc\", outside the library (a program's file?)"
        continue
        ;;
      esac
    else
      continue
    fi
    [[ $dep == "$mod" ]] && continue
    if [[ -z ${layer[$dep]:-} ]]; then
      echo "$f: includes $inc, of module $dep, which is in no row of the layer table"
    elif ((layer[$dep] > layer[$mod])); then
      echo "$f: $mod (layer ${layer[$mod]}) includes $inc of $dep (layer ${layer[$dep]}), above it"
    fi
    [[ $mod == util ]] && echo "$f: util includes $inc: util includes nothing of ours"
    uses["$mod $dep"]=1
  done < <(grep -rHE '^[[:space:]]*#[[:space:]]*include' --include='*.cpp' --include='*.hpp' --include='*.cu' \
    --include='*.cuh' --include='*.def' "$tree/src" "$tree/include" | sort)
  local k
  for k in "${!uses[@]}"; do
    read -r m n <<<"$k"
    [[ -n ${uses["$n $m"]:-} && $m < $n ]] && echo "modules $m and $n include each other"
  done
  local h
  for h in "$tree"/include/zinf/*.hpp; do
    grep -En '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(CLI/|nlohmann/json\.hpp)' "$h" | sed "s|^|$h: a heavy library in a public header: |"
  done
  return 0
}

layers_of "$DOC" >"$W/layers"
check "docs/ARCHITECTURE.md's table names every module of libzinf/src (got: $(tr '\n' ' ' <"$W/layers"))" \
  bash -c 'for m in $(ls "$1"); do grep -q "^$m " "$2" || { echo "no row for $m"; exit 1; }; done' _ "$ROOT/libzinf/src" "$W/layers"
cp -r "$ROOT/libzinf" "$W/lib"
violations "$W/lib" "$W/layers" >"$W/found"
check "every include in libzinf keeps the layer rule$( [[ -s $W/found ]] && printf ' (%s)' "$(head -n 5 "$W/found" | tr '\n' ';')")" \
  test ! -s "$W/found"

# The check bites: an include upward, a private one upward, util reaching up,
# a program's file, a heavy library in a public header.
cp -r "$ROOT/libzinf" "$W/bad"
printf '#include <zinf/zero.hpp>\n' >>"$W/bad/src/util/$(ls "$W/bad/src/util" | grep -m1 '\.cpp$')"
printf '#include "../model/%s"\n' "$(ls "$W/bad/src/model" | grep -m1 '\.hpp$' || echo x.hpp)" >>"$W/bad/src/io/$(ls "$W/bad/src/io" | grep -m1 '\.cpp$')"
printf '#include "../../../trainer/main.cpp"\n' >>"$W/bad/src/zero/$(ls "$W/bad/src/zero" | grep -m1 '\.cpp$')"
printf '#include <nlohmann/json.hpp>\n' >>"$W/bad/include/zinf/io.hpp"
violations "$W/bad" "$W/layers" >"$W/bad.found"
check "…an include upward is found (util including zero.hpp)" grep -q "util (layer 1) includes <zinf/zero.hpp>" "$W/bad.found"
check "…util reaching for anything of ours is found" grep -q "util includes nothing of ours" "$W/bad.found"
check "…a private include upward is found (io including a model file)" grep -q "io (layer 2) includes .*model" "$W/bad.found"
check "…a program's file included by the library is found" grep -q "outside the library" "$W/bad.found"
check "…nlohmann/json.hpp in a public header is found" grep -q "a heavy library in a public header" "$W/bad.found"
# A table that contradicts the code: mem moved beside util, under io.
sed 's/^| 3 | mem |/| 1 | mem |/' "$DOC" >"$W/doc.md"
layers_of "$W/doc.md" >"$W/layers.bad"
violations "$W/lib" "$W/layers.bad" >"$W/doc.found"
check "…and a table that puts mem beside util is contradicted by mem's includes of io" grep -q "mem (layer 1) includes <zinf/io.hpp>" "$W/doc.found"
finish
