#!/usr/bin/env bash
# Does a file larger than the pinned pool cross it as fast as the drive reads?
# zinf-nvmebench's best read versus zinf-streambench (mem::Stream through a
# --pinned pool) on one file in one run, with streambench's peak resident memory:
#
#   scripts/bench-stream.sh --dir DIR [--size 4GiB] [--pinned 256MiB] [--pinned-buffer 16MiB]
#                           [--rounds 5] [-b ..] [-d ..] [-Q ..] [--min-ratio 0.9]
#
# The same harness as scripts/bench-api.sh (see there).
exec "$(dirname "$0")/bench-api.sh" --stream "$@"
