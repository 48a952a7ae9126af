"""Merges the JSON rows of several ``bench.gpu.kernels`` runs into one kernel table.

    python -m bench.gpu.merge OUT.md --ceilings C.json --gemm A.json B.json --rows R.json \\
        [--note TEXT]...

Each key is taken from the last file that holds it (a re-run replaces an earlier one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.gpu.common import Ceilings, geomean
from bench.gpu.kernels import gemm_table, rows_table


def load(paths: list[Path]) -> list[dict[str, Any]]:
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in paths:
        for row in json.loads(path.read_text()):
            rows[(row["kernel"], row["label"], row["dtype"])] = row
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu.merge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--ceilings", type=Path, required=True)
    parser.add_argument("--gemm", type=Path, nargs="+", default=[])
    parser.add_argument("--rows", type=Path, nargs="+", default=[])
    parser.add_argument("--title", default="Kernel table")
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args(argv)
    ceilings = Ceilings(**json.loads(args.ceilings.read_text()))
    parts = [f"# {args.title}", "", *(f"- {n}" for n in args.note), ""]
    gemms, rows = load(args.gemm), load(args.rows)
    every = gemms + rows
    parts += [
        f"- all {len(every)} keys: geomean tuned / default config "
        f"{geomean([r['default_ms'] / r['tuned_ms'] for r in every]):.3f}; tuning wall time per "
        f"key median {sorted(r['tune_s'] for r in every)[len(every) // 2]} s, max "
        f"{max(r['tune_s'] for r in every)} s",
        f"- records keyed: {', '.join(sorted({r['record_device'] for r in every}))}",
        "",
    ]
    if gemms:
        table, heads = gemm_table(gemms, ceilings)
        parts += ["## GEMM (Llama-3-8B projections)", "", *(f"- {h}" for h in heads), "", table,
                  ""]  # fmt: skip
    if rows:
        table, heads = rows_table(rows, ceilings)
        parts += ["## Row kernels and bias+GELU", "", *(f"- {h}" for h in heads), "", table, ""]
    args.out.write_text("\n".join(parts))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
