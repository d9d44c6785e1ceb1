# Sourced by the zinf-train suites (train.sh, engine.sh) after lib.bash:
# states made by zinf-shard, and what their manifests and step lines say.
# Each suite sets W (its folder), M (the default model), SH (zinf-shard)
# and POOL (the pinned pool's options) first.

# state NAME [LAYOUT OPTIONS...]: a fresh state of $M (or --model) in $W/NAME;
# its manifest is $W/NAME/manifest.jsonl. The same options and seed give the
# same bytes, so two states made alike are copies of one init.
state() {
  local name=$1
  shift
  rm -rf "${W:?}/$name"
  local model=(--model "$M")
  [[ " $* " == *" --model "* ]] && model=()
  "$SH" layout "${model[@]}" "$@" | "$SH" init --dir "$W/$name" "${POOL[@]}" >/dev/null 2>"$W/$name.init.err" ||
    echo "zinf-shard init of $name failed: $(<"$W/$name.init.err")" >&2
}
mf() { echo "$W/$1/manifest.jsonl"; }
# The step every record of a manifest is at, if they agree ("mixed" if not).
manifest_step() { jq -s -r '[.[] | select(has("schema") | not) | .step // 0] | unique | if length == 1 then .[0] else "mixed" end' "$1"; }
# losses FILE [FROM [TO]]: the loss of each JSON line with FROM <= step <= TO, one a line, as printed.
losses() { jq -c --argjson a "${2:-1}" --argjson b "${3:-1e18}" 'select(.step >= $a and .step <= $b) | .loss' "$1"; }
# state_sums DIR: every state file's sha256 (the manifest, which names its
# folder, and scratch files left out).
state_sums() { (cd "$1" && find . -type f -name '*.bin' ! -name 'grad.bin' ! -name 'activations.bin' -print0 | sort -z | xargs -0r sha256sum); }
