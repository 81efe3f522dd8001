"""Picks between two `kda` builds from a `bench/ab.sh` log: the new one only if it is not more
than 0.5% slower on fixed_8192 and fixed_32k (the floor-ratio targets) and faster over all
shapes. Prints the chosen build's directory (its bundle).

    python3 bench/choose.py AB_LOG OLD/kda NEW/kda
"""
import re, sys, collections
t = collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(sys.argv[1]):
    m = re.match(r'(\S+)\s+(\S+/kda)\s+kernel Hopper: median ([\d.]+)', l)
    if m:
        t[m.group(2)][m.group(1)].append(float(m.group(3)))
a, b = sys.argv[2], sys.argv[3]  # old, new
med = lambda k, s: sorted(t[k][s])[len(t[k][s]) // 2]
ok = all(med(b, s) <= 1.005 * med(a, s) for s in ("fixed_8192", "fixed_32k"))
better = sum(med(b, s) for s in t[b]) < sum(med(a, s) for s in t[a])
print((b if ok and better else a).rsplit("/", 1)[0])
