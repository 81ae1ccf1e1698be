"""Turns the raw HTTP benchmark results into a table of ratios to bare and
an SVG bar chart. Usage: bench_report.py raw.tsv chart.svg > report.md"""

import statistics
import sys
from collections import defaultdict

LABELS = {
    "bare": "axum, bare",
    "tollgate": "tollgate (memory)",
    "governor": "tower_governor",
    "tollgate-redis": "tollgate (Redis)",
    "tollgate-redis-lease": "tollgate (Redis, leases)",
}


def main(raw, svg_path):
    rows = defaultdict(lambda: {"rps": [], "p99": [], "cpu": [], "user": [], "sys": []})
    order = []
    with open(raw) as f:
        next(f)
        for line in f:
            mode, _, rps, p99, cpu, user, system = line.split("\t")
            if mode not in order:
                order.append(mode)
            for name, value in zip(("rps", "p99", "cpu", "user", "sys"), (rps, p99, cpu, user, system)):
                rows[mode][name].append(float(value))
    med = {m: (statistics.median(r["rps"]), statistics.median(r["p99"])) for m, r in rows.items()}
    base_rps, base_p99 = med["bare"]
    rounds = len(rows["bare"]["rps"])
    print(f"Medians of {rounds} interleaved rounds; ratios to bare from the same run.\n")
    print("| server | requests/s | throughput vs bare | p99 latency | p99 vs bare |")
    print("|---|---:|---:|---:|---:|")
    for m in order:
        rps, p99 = med[m]
        print(f"| {LABELS.get(m, m)} | {rps:,.0f} | {rps / base_rps:.1%} | {p99:.2f} ms | {p99 / base_p99:.2f}x |")
    print_cpu(rows, order)
    write_svg(svg_path, order, med, base_rps, base_p99, rounds)


def print_cpu(rows, order):
    """Server CPU per request: the median, and what each configuration adds
    to bare, per round (rounds are interleaved, so a round's configurations
    ran under the same conditions) and as the median of those."""
    def added(m, what):
        return [c - b for c, b in zip(rows[m][what], rows["bare"][what])]

    print("\nServer CPU time per request (user + system, all threads), median of the rounds;")
    print("added = this configuration minus bare in the same round, median over rounds;")
    print("user and system time added, apart, as means over rounds (the kernel's split")
    print("is sampled at the clock tick, so one round's is coarse).\n")
    print("| server | CPU per request | added to bare | added, per round | user added | system added |")
    print("|---|---:|---:|---|---:|---:|")
    for m in order:
        per_round = ", ".join(f"{a:+.2f}" for a in added(m, "cpu"))
        user, system = (statistics.mean(added(m, w)) for w in ("user", "sys"))
        print(f"| {LABELS.get(m, m)} | {statistics.median(rows[m]['cpu']):.2f} us | "
              f"{statistics.median(added(m, 'cpu')):+.2f} us | {per_round} | {user:+.2f} us | {system:+.2f} us |")
    if "tollgate" in rows and "governor" in rows:
        tg = statistics.median(added("tollgate", "cpu"))
        gov = statistics.median(added("governor", "cpu"))
        if gov > 0:
            print(f"\ntollgate adds {tg / gov:.2f}x what tower_governor adds.")
        tg, gov = (statistics.mean(added(m, "user")) for m in ("tollgate", "governor"))
        if gov > 0:
            print(f"In user time, {tg / gov:.2f}x.")


def write_svg(path, order, med, base_rps, base_p99, rounds):
    width, bar_h, gap, left = 640, 22, 10, 170
    panels = [("Throughput, % of bare (higher is better)", lambda m: med[m][0] / base_rps, "{:.1%}"),
              ("p99 latency, x bare (lower is better)", lambda m: med[m][1] / base_p99, "{:.2f}x")]
    colors = {"bare": "#9e9e9e", "tollgate": "#2e7d32", "governor": "#1565c0", "tollgate-redis": "#ef6c00",
              "tollgate-redis-lease": "#ad1457"}
    parts, y = [], 30
    parts.append(f'<text x="10" y="18" font-size="14" font-weight="bold">axum hello-world under wrk on loopback: medians of {rounds} rounds</text>')
    for title, value, fmt in panels:
        y += 16
        parts.append(f'<text x="10" y="{y}" font-size="13">{title}</text>')
        y += 8
        top = max(value(m) for m in order) * 1.1
        for m in order:
            v = value(m)
            w = (width - left - 80) * v / top
            parts.append(f'<text x="10" y="{y + 16}" font-size="12">{LABELS.get(m, m)}</text>')
            parts.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colors.get(m, "#555")}"/>')
            parts.append(f'<text x="{left + w + 6:.1f}" y="{y + 16}" font-size="12">{fmt.format(v)}</text>')
            y += bar_h + gap
        y += 10
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>{"".join(parts)}</svg>\n')
    with open(path, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
