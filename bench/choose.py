"""Picks one `kda` build from a `bench/ab.sh` log: among the candidates, the fastest on
fixed_8192 + fixed_32k (the floor-ratio targets) that is faster than the current build there and
not more than 0.5% slower than it on any shape; else the current build. Prints the chosen
build's directory (its bundle).

    python3 bench/choose.py AB_LOG CURRENT/kda CANDIDATE/kda...
"""
import re, sys, collections
t = collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(sys.argv[1]):
    m = re.match(r'(\S+)\s+(\S+/kda)\s+kernel Hopper: median ([\d.]+)', l)
    if m:
        t[m.group(2)][m.group(1)].append(float(m.group(3)))
cur, candidates = sys.argv[2], sys.argv[3:]
med = lambda k, s: sorted(t[k][s])[len(t[k][s]) // 2]
targets = lambda k: med(k, "fixed_8192") + med(k, "fixed_32k")
best = cur
for c in candidates:
    ok = all(med(c, s) <= 1.005 * med(cur, s) for s in t[cur])
    if ok and targets(c) < targets(best):
        best = c
print(best.rsplit("/", 1)[0])
