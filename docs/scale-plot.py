#!/usr/bin/env python3
"""Builds the table and the plot of docs/scale.md from saved `cm-bench wireup` outputs.

Usage: docs/scale-plot.py DIR   (DIR holds <mode>-<nodes>-<ppn>-<loss>.txt, one run each)
Prints the Markdown table; writes docs/scale.svg (time to full mesh against N).
"""
import math
import os
import re
import sys

MODES = ["rc", "xrc", "xrc-sidr"]
NODES = [64, 512, 4096]
PPNS = [16, 64]
LOSSES = ["0", "0.01"]


def parse(path):
    try:
        text = open(path).read()
    except OSError:
        return None
    r = {}
    m = re.search(r"^wireup: \S+ \d+×\d+: ([\d.]+) s to full mesh; (\d+) QPs/node; (\d+) B CM state/node; (\d+) MADs$", text, re.M)
    if not m:
        return None
    r["last"], r["qps"], r["bytes"], r["mads"] = float(m[1]), int(m[2]), int(m[3]), int(m[4])
    r["method"] = "full" if "method: full simulation" in text else "model"
    m = re.search(r"p50 ([\d.]+) s, p99 ([\d.]+) s", text)
    r["p50"], r["p99"] = float(m[1]), float(m[2])
    r["retx"] = int(re.search(r"retransmissions: (\d+)", text)[1])
    r["restarts"] = int(re.search(r"started again after a failure: (\d+)", text)[1])
    m = re.search(r"simulator: wall ([\d.]+) s, \d+ steps, peak RSS (\d+) MiB", text)
    r["wall"], r["rss"] = float(m[1]), int(m[2])
    r["incomplete"] = "INCOMPLETE" in text
    return r


def fmt_bytes(b):
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return f"{b / k:.1f} {unit}"
    return f"{b} B"


def main():
    d = sys.argv[1]
    rows = {}
    print("| N × P | loss | mode | method | time to full mesh: p50 / p99 / last (s) | QPs/node | CM state/node | MADs | retransmissions | restarts | sim wall (s) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in NODES:
        for p in PPNS:
            for loss in LOSSES:
                for mode in MODES:
                    r = parse(os.path.join(d, f"{mode}-{n}-{p}-{loss}.txt"))
                    rows[(mode, n, p, loss)] = r
                    lp = "1 %" if loss != "0" else "0"
                    if r is None:
                        print(f"| {n} × {p} | {lp} | {mode} | not run | – | – | – | – | – | – | – | – |")
                        continue
                    t = f"{r['p50']:.3f} / {r['p99']:.3f} / {r['last']:.3f}"
                    if r["incomplete"]:
                        t += " (incomplete)"
                    print(f"| {n} × {p} | {lp} | {mode} | {r['method']} | {t} | {r['qps']:,} | {fmt_bytes(r['bytes'])} | {r['mads']:,} | {r['retx']:,} | {r['restarts']:,} | {r['wall']:.1f} | {r['rss']:,} |")
    svg(rows, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale.svg"))


def svg(rows, out):
    w, h, ml, mr, mt, mb = 820, 460, 70, 220, 40, 50
    pts = [r["last"] for r in rows.values() if r]
    lo = 10 ** math.floor(math.log10(min(pts)))
    hi = 10 ** math.ceil(math.log10(max(pts)))
    xs = {n: ml + i * (w - ml - mr) / (len(NODES) - 1) for i, n in enumerate(NODES)}

    def y(v):
        return mt + (h - mt - mb) * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))

    colors = {"rc": "#d62728", "xrc": "#1f77b4", "xrc-sidr": "#2ca02c"}
    dash = {("16", "0"): "", ("64", "0"): "6,3", ("16", "0.01"): "2,3", ("64", "0.01"): "8,3,2,3"}
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{ml}" y="22" font-size="14">cm-bench wireup: simulated time to full mesh (last process) against N</text>']
    e = int(math.log10(lo))
    while 10 ** e <= hi:
        yy = y(10 ** e)
        s.append(f'<line x1="{ml}" x2="{w - mr}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{ml - 6}" y="{yy + 4:.1f}" text-anchor="end">{10 ** e:g} s</text>')
        e += 1
    for n, xx in xs.items():
        s.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{mt}" y2="{h - mb}" stroke="#eee"/>')
        s.append(f'<text x="{xx:.1f}" y="{h - mb + 18}" text-anchor="middle">{n}</text>')
    s.append(f'<text x="{(ml + w - mr) / 2:.0f}" y="{h - 10}" text-anchor="middle">nodes N (log scale)</text>')
    ly = mt
    for mode in MODES:
        for p in PPNS:
            for loss in LOSSES:
                pts = [(xs[n], y(rows[(mode, n, p, loss)]["last"])) for n in NODES if rows.get((mode, n, p, loss))]
                if not pts:
                    continue
                d = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
                da = dash[(str(p), loss)]
                s.append(f'<polyline points="{d}" fill="none" stroke="{colors[mode]}" stroke-width="2" stroke-dasharray="{da}"/>')
                for a, b in pts:
                    s.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colors[mode]}"/>')
                lab = f"{mode}, P={p}, loss {'1 %' if loss != '0' else '0'}"
                s.append(f'<line x1="{w - mr + 10}" x2="{w - mr + 40}" y1="{ly}" y2="{ly}" stroke="{colors[mode]}" stroke-width="2" stroke-dasharray="{da}"/>')
                s.append(f'<text x="{w - mr + 45}" y="{ly + 4}">{lab}</text>')
                ly += 16
    s.append("</svg>")
    open(out, "w").write("\n".join(s) + "\n")


if __name__ == "__main__":
    main()
