#!/usr/bin/env python3
"""Draws the status table's cost against its size as an SVG (standard library only).

    python3 benches/ceilings/chart.py scale.tsv > benches/scale.svg

The input is what scale.sh writes with SCALE_TSV: a header line, then one line a cell,
tab-separated: keys, round, idem tps, bare tps, idem WAL per message, bare WAL per message.
Two panels, keys on a logarithmic axis (0 drawn at the left edge): new messages relative
to the empty table's rate (the rounds' mean), and WAL per message in bytes, idem's and the
bare transaction's.
"""

import math
import sys
from collections import defaultdict

WIDTH, HEIGHT, PAD = 360, 260, 48
COLORS = {"idem": "#1f77b4", "bare": "#ff7f0e"}


def read(path):
    cells = defaultdict(list)
    with open(path) as lines:
        next(lines)
        for line in lines:
            if line.strip():
                keys, _, idem_tps, bare_tps, idem_wal, bare_wal = line.split("\t")
                cells[int(keys)].append(
                    (float(idem_tps), float(bare_tps), float(idem_wal), float(bare_wal))
                )
    return {keys: [sum(col) / len(col) for col in zip(*rows)] for keys, rows in cells.items()}


def x_of(keys, sizes):
    low = math.log10(min(k for k in sizes if k > 0)) - 0.5
    high = math.log10(max(sizes))
    value = low if keys == 0 else math.log10(keys)
    return PAD + (value - low) / (high - low) * (WIDTH - 2 * PAD)


def panel(left, title, series, sizes, top_value, unit):
    out = [f'<g transform="translate({left},0)">',
           f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>',
           f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>']
    y_of = lambda value: HEIGHT - PAD - value / top_value * (HEIGHT - 2 * PAD)
    for step in range(5):
        value = top_value * step / 4
        out.append(f'<text x="{PAD - 6}" y="{y_of(value) + 4:.1f}" text-anchor="end" font-size="10">'
                   f'{value:g}{unit}</text>')
    for keys in sizes:
        label = "0" if keys == 0 else f"{keys / 1e6:g}M"
        out.append(f'<text x="{x_of(keys, sizes):.1f}" y="{HEIGHT - PAD + 14}" text-anchor="middle" '
                   f'font-size="10">{label}</text>')
    for row, (name, values) in enumerate(series.items()):
        points = " ".join(f"{x_of(k, sizes):.1f},{y_of(v):.1f}" for k, v in zip(sizes, values))
        out.append(f'<polyline fill="none" stroke="{COLORS[name]}" stroke-width="2" points="{points}"/>')
        out.append(f'<text x="{WIDTH - PAD}" y="{PAD + 14 * row}" text-anchor="end" font-size="11" '
                   f'fill="{COLORS[name]}">{name}</text>')
    out.append(f'<text x="{WIDTH / 2}" y="{HEIGHT - 10}" text-anchor="middle" font-size="11">'
               'keys in the status table</text></g>')
    return out


def main():
    means = read(sys.argv[1])
    sizes = sorted(means)
    empty_idem, empty_bare = means[sizes[0]][0], means[sizes[0]][1]
    relative = {
        "idem": [means[k][0] / empty_idem for k in sizes],
        "bare": [means[k][1] / empty_bare for k in sizes],
    }
    wal = {"idem": [means[k][2] for k in sizes], "bare": [means[k][3] for k in sizes]}
    top_wal = 10 ** math.ceil(math.log10(max(wal["idem"])))
    top_wal = top_wal / 2 if max(wal["idem"]) < top_wal / 2 else top_wal
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * WIDTH}" height="{HEIGHT}" '
           'font-family="sans-serif">', '<rect width="100%" height="100%" fill="white"/>']
    svg += panel(0, "new messages, relative to the empty table", relative, sizes, 1.2, "x")
    svg += panel(WIDTH, "WAL per message", wal, sizes, top_wal, " B")
    svg.append("</svg>")
    print("\n".join(svg))


if __name__ == "__main__":
    main()
