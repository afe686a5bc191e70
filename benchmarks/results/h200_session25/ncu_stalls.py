"""Warp-stall samples of an ncu source-page SASS CSV: per kernel, the top instructions and the
totals by stall reason and by opcode."""
import csv, sys, collections
path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
lines = open(path).read().splitlines()
blocks, cur = [], None
for ln in lines:
    if ln.startswith('"Kernel Name"'):
        cur = [ln.split('","')[1].rstrip('",')[:70], []]
        blocks.append(cur)
    elif cur is not None:
        cur[1].append(ln)
for name, body in blocks:
    rows = list(csv.reader(body))
    hdr, rows = rows[0], rows[1:]
    ix = {h: i for i, h in enumerate(hdr)}
    S = ix["Warp Stall Sampling (All Samples)"]
    reasons = [h for h in hdr if h.startswith("stall_")]
    tot = sum(float(r[S] or 0) for r in rows)
    print(f"== {name}  samples {tot:.0f}")
    by_reason = {h: sum(float(r[ix[h]] or 0) for r in rows) for h in reasons}
    print("  reasons:", ", ".join(f"{k[6:]} {v/tot:.1%}" for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1]) if v / tot > 0.005))
    by_op = collections.Counter()
    for r in rows:
        op = r[ix["Source"]].split()[0] if r[ix["Source"]] else "?"
        if op.startswith("@"):
            op = r[ix["Source"]].split()[1]
        by_op[op.split(".")[0]] += float(r[S] or 0)
    print("  by opcode:", ", ".join(f"{k} {v/tot:.1%}" for k, v in by_op.most_common(12)))
    rows.sort(key=lambda r: -float(r[S] or 0))
    for r in rows[:top]:
        rs = sorted(((float(r[ix[h]] or 0), h[6:]) for h in reasons), reverse=True)[:2]
        print(f"  {float(r[S])/tot:6.1%} {r[ix['Address']]:>6} {r[ix['Source']][:60]:60s} {rs[0][1]} {rs[1][1]}")
