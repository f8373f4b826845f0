"""`make bench`: run every benchmark module and print one summary; results also go to bench/results/."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
import traceback
from pathlib import Path

import bench


def main(argv: list[str]) -> int:
    wanted = set(argv)
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    if wanted:
        names = [n for n in names if n in wanted or n.removeprefix("bench_") in wanted]
    summary: dict[str, dict[str, float] | str] = {}
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        started = time.monotonic()
        try:
            module = importlib.import_module(f"bench.{name}")
            summary[name] = module.run()
        except Exception:
            traceback.print_exc()
            summary[name] = "failed"
        print(f"({name} took {time.monotonic() - started:.1f}s)", flush=True)

    print("\n=== summary ===")
    for name, figures in summary.items():
        if isinstance(figures, str):
            print(f"{name}: {figures}")
            continue
        for key, value in figures.items():
            print(f"{name}.{key} = {value:.4g}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(summary, indent=2))
    return 1 if any(isinstance(v, str) for v in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
