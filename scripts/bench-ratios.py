#!/usr/bin/env python3
"""Draws the guide's picture of the benchmark ratios: for each benchmark
with a peer in the same run, tollgate's cost divided by the peer's (governor
in memory, tower_governor through the layer), read from BENCHMARKS.md's
current tables. Below 1, tollgate costs less.

    python3 scripts/bench-ratios.py      # rewrites src/guide/bench-ratios.svg

Run it after changing a table it reads; a row it cannot find stops it with
the row's name, so a renamed row is noticed rather than drawn stale. Python's
standard library only.
"""

import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "BENCHMARKS.md"
OUT = ROOT / "src/guide/bench-ratios.svg"

# (label, section heading starts with, table number in the section,
#  tollgate's row and column, the peer's row and column, or None where
#  tollgate's cell is the ratio already). A row is named by the start of its
# first cell; columns count from 0 (the row's name).
RATIOS = [
    ("hot key, time, GCRA", "In memory: one check", 0, ("GCRA", 2), None),
    ("hot key, instructions, GCRA", "In memory: instructions", 0, ("GCRA", 2), ("governor", 2)),
    ("hot key, instructions, fixed window", "In memory: instructions", 0, ("fixed window", 2), ("governor", 2)),
    ("hot key, instructions, sliding window", "In memory: instructions", 0, ("sliding window", 2), ("governor", 2)),
    ("hot key, instructions, sliding log", "In memory: instructions", 0, ("sliding log", 2), ("governor", 2)),
    ("1M keys, time, GCRA", "In memory: a million keys", 0, ("GCRA", 1), ("GCRA", 2)),
    ("1M keys, time, sliding window", "In memory: a million keys", 0, ("sliding window", 1), ("sliding window", 2)),
    # Throughput, so the peer's over tollgate's: time per check, as the others.
    ("one hot key, 16 threads, time, GCRA", "In memory: many cores", 0, ("governor", 5), ("GCRA", 5)),
    ("bytes per key, IP keys", "In memory: bytes per key", 0, ("one number", 1), ("governor", 1)),
    ("bytes per key, 64-byte keys", "In memory: bytes per key", 0, ("one number", 2), ("governor", 2)),
    ("layer, instructions added", "Through the layer", 0, ("tollgate", 1), ("tower_governor", 1)),
    ("HTTP, server CPU added", "Over HTTP", 0, ("tollgate, per-IP", 4), ("tower_governor", 4)),
    ("HTTP, instructions added, 2 cores", "Over HTTP", 1, ("tollgate, per-IP", 2), ("tower_governor", 2)),
]

NUMBER = re.compile(r"\d{1,3}(?: \d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


def tables(text):
    """{section heading: [table, ...]}, a table a list of rows of cells."""
    sections, heading, table = {}, None, None
    for line in text.splitlines():
        if line.startswith("## "):
            heading, table = line[3:].strip(), None
            sections[heading] = []
        elif heading and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if set("".join(cells)) <= set("-:"):
                continue
            if table is None:
                table = []
                sections[heading].append(table)
            table.append(cells)
        else:
            table = None
    return sections


def value(cell):
    """The median of the runs in a cell ("44.4 / 44.4 / 45.0 ns"), each
    run's first number ("+0.75 (+0.75) µs" is 0.75)."""
    runs = []
    for run in cell.split("/"):
        m = NUMBER.search(run)
        if m:
            runs.append(float(m.group().replace(" ", "")))
    if not runs:
        raise ValueError(f"no number in {cell!r}")
    return statistics.median(runs)


def lookup(sections, section, number, row, column):
    heading = next((h for h in sections if h.startswith(section)), None)
    if heading is None:
        sys.exit(f"bench-ratios: no section {section!r} in BENCHMARKS.md")
    try:
        table = sections[heading][number]
    except IndexError:
        sys.exit(f"bench-ratios: {heading!r} has no table {number}")
    # The header row is skipped: a row is data.
    for cells in table[1:]:
        if cells[0].startswith(row):
            return value(cells[column])
    sys.exit(f"bench-ratios: no row {row!r} in {heading!r}")


def draw(ratios):
    left, width, row, top = 270, 520, 26, 58
    scale = width / 2.2
    height = top + row * len(ratios) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {left + width + 70} {height}" '
        f'width="{left + width + 70}" height="{height}" font-family="sans-serif" font-size="13">',
        f'<text x="10" y="20" font-weight="bold">tollgate\'s cost / its peer\'s in the same run '
        f"(below 1: tollgate costs less)</text>",
        '<text x="10" y="38" fill="#555">peer: governor in memory, tower_governor through '
        "the layer and over HTTP; from BENCHMARKS.md</text>",
    ]
    for i, (label, ratio) in enumerate(ratios):
        y = top + i * row
        colour = "#3a8f4a" if ratio <= 1.0 else "#d0822a"
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{label}</text>')
        out.append(
            f'<rect x="{left}" y="{y + 3}" width="{ratio * scale:.1f}" height="{row - 8}" '
            f'fill="{colour}"/>'
        )
        out.append(f'<text x="{left + ratio * scale + 6:.1f}" y="{y + 15}">{ratio:.2f}x</text>')
    bottom = top + row * len(ratios)
    for tick in (0.5, 1.0, 1.5, 2.0):
        x = left + tick * scale
        dash = "" if tick == 1.0 else ' stroke-dasharray="3,3"'
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#333"{dash}/>'
        )
        out.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{tick}x</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    sections = tables(SOURCE.read_text(encoding="utf-8"))
    ratios = []
    for label, section, number, mine, peer in RATIOS:
        ratio = lookup(sections, section, number, *mine)
        if peer is not None:
            ratio /= lookup(sections, section, number, *peer)
        ratios.append((label, ratio))
    OUT.write_text(draw(ratios), encoding="utf-8")
    for label, ratio in ratios:
        print(f"{ratio:5.2f}x  {label}")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
