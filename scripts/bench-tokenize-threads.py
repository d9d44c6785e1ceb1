#!/usr/bin/env python3
"""zinf-tokenize on one thread and on two, paired round by round (BENCHMARKS.md,
"Tokenizing"; issue 46's two-thread target), beside the machine's own two-core
ceiling: two one-thread runs at once, over one alone (a VM's second core is
not always a whole one).

Each round runs every binary on 1 then 2 threads, then two 1-thread runs of
the last binary at once; the figure is --json's input_mb_per_s (the encode,
the tokenizer's load left out; the output's commit in). Prints each round,
then per binary the medians and the pair ratios (2 threads over 1, the same
round).

Usage: scripts/bench-tokenize-threads.py [--bin NAME=PATH]... [--tokenizer JSON] FILE ROUNDS
  --bin       a binary to time (default: this tree's bin/zinf-tokenize, as "new");
              give two to pair an old build against a new one
  --tokenizer default .cache/tokenizer-refs/json/gpt2.json (scripts/tokenizer-refs.sh)
Outputs go to a temporary folder beside FILE, removed at the end.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser(usage=__doc__)
ap.add_argument("--bin", action="append", default=[])
ap.add_argument("--tokenizer", default=os.path.join(root, ".cache/tokenizer-refs/json/gpt2.json"))
ap.add_argument("file")
ap.add_argument("rounds", type=int)
a = ap.parse_args()
bins = dict(b.split("=", 1) for b in a.bin) if a.bin else {"new": os.path.join(root, "bin/zinf-tokenize")}
for name, path in bins.items():
    if not os.access(path, os.X_OK):
        sys.exit(f"bench-tokenize-threads: {name}={path} is not an executable")
if not os.path.isfile(a.tokenizer):
    sys.exit(f"bench-tokenize-threads: no tokenizer at {a.tokenizer} (run scripts/tokenizer-refs.sh)")
out = tempfile.mkdtemp(prefix="tok-threads-", dir=os.path.dirname(os.path.abspath(a.file)))
last = list(bins)[-1]


def cmd(b, t, o):
    return [bins[b], "-t", a.tokenizer, "--sep", "none", "-o", os.path.join(out, o), "--json", "--threads", str(t),
            a.file]


def stamp():
    return time.strftime("%H:%M:%S", time.gmtime()) + " load " + " ".join(open("/proc/loadavg").read().split()[:3])


res = {(b, t): [] for b in bins for t in (1, 2)}
ceiling = []
try:
    print("#", stamp(), "file", a.file, flush=True)
    for r in range(a.rounds):
        line = f"round {r}"
        for b in bins:
            for t in (1, 2):
                p = subprocess.run(cmd(b, t, f"{b}{t}.bin"), capture_output=True, text=True, check=True)
                v = json.loads(p.stdout)["input_mb_per_s"]
                res[(b, t)].append(v)
                line += f" {b}{t}={v:.1f}"
        ps = [subprocess.Popen(cmd(last, 1, f"c{i}.bin"), stdout=subprocess.PIPE, text=True) for i in (1, 2)]
        vs = [json.loads(p.communicate()[0])["input_mb_per_s"] for p in ps]
        c = sum(vs) / res[(last, 1)][-1]
        ceiling.append(c)
        line += f" two-processes={vs[0]:.1f}+{vs[1]:.1f} ({c:.2f}x)"
        print(line, flush=True)
    for b in bins:
        ratios = [y / x for x, y in zip(res[(b, 1)], res[(b, 2)])]
        m1, m2 = statistics.median(res[(b, 1)]), statistics.median(res[(b, 2)])
        print(f"{b}: 1 thread median {m1:.1f} MB/s, 2 threads {m2:.1f}, ratio of medians {m2 / m1:.2f}; "
              f"pair ratios median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
    print(f"two 1-thread processes at once over one alone: median {statistics.median(ceiling):.2f} "
          f"(min {min(ceiling):.2f}, max {max(ceiling):.2f})")
    print("#", stamp(), flush=True)
finally:
    shutil.rmtree(out, ignore_errors=True)
