"""How long ``import kvlab`` takes, and what the first use of its API then loads.

Each figure is the median wall time of fresh interpreters (``python -c ...``), printed next to
an empty interpreter and ``import numpy`` measured in the same run, so the numbers read on a busy
machine too. Then one ``python -X importtime`` run per statement lists the modules that cost
most (self time, and cumulative time of kvlab's own modules). Target (issue 16): ``import
kvlab`` under 0.3 s on a quiet machine.

    python bench/bench_import.py [--runs 7] [--top 12]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

STATEMENTS = {
    "empty interpreter": "pass",
    "import numpy": "import numpy",
    "import kvlab": "import kvlab",
    "kvlab.simulate (first use)": "import kvlab; kvlab.simulate",
    "every public name (what the old eager __init__ loaded)":
        "import kvlab; [getattr(kvlab, n) for n in kvlab.__all__ if n not in ('measure', 'plots')]",
}
TARGET_S = 0.3


def wall_s(code: str, runs: int) -> float:
    """Median wall time of ``runs`` fresh interpreters running ``code`` (seconds)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def importtime(code: str) -> list[tuple[str, int, int]]:
    """``(module, self_us, cumulative_us)`` of every import ``code`` makes, from ``-X importtime``."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], check=True, capture_output=True,
                         text=True).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|")
        rows.append((name.strip(), int(self_us), int(cum_us)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per statement")
    parser.add_argument("--top", type=int, default=12, help="offenders listed per statement")
    args = parser.parse_args()

    print(f"median wall time of {args.runs} fresh interpreters ({sys.executable})")
    walls = {label: wall_s(code, args.runs) for label, code in STATEMENTS.items()}
    base = walls["empty interpreter"]
    for label, s in walls.items():
        print(f"  {label:<58} {s:6.3f} s   (+{s - base:6.3f} s over an empty interpreter)")
    kv, np_s = walls["import kvlab"] - base, walls["import numpy"] - base
    print(f"import kvlab: {kv:.3f} s above the interpreter's start, {kv / np_s:.2f}x `import numpy`; "
          f"target < {TARGET_S} s: {'met' if walls['import kvlab'] < TARGET_S else 'NOT met on this machine'}")

    for label in ("import kvlab", "kvlab.simulate (first use)"):
        rows = importtime(STATEMENTS[label])
        total_ms = sum(r[1] for r in rows) / 1e3
        print(f"\n-X importtime, {label}: {len(rows)} modules, {total_ms:.0f} ms of import self time")
        print("  most self time:")
        for name, self_us, _ in sorted(rows, key=lambda r: -r[1])[:args.top]:
            print(f"    {self_us / 1e3:8.1f} ms  {name}")
        own = [r for r in rows if r[0].split(".")[0] == "kvlab"]
        if own:
            print("  kvlab modules, cumulative (with what they import):")
            for name, _, cum_us in sorted(own, key=lambda r: -r[2])[:args.top]:
                print(f"    {cum_us / 1e3:8.1f} ms  {name}")


if __name__ == "__main__":
    main()
