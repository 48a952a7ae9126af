"""The device's two ceilings: device-to-device copy TB/s (read + write) and bf16 8192³
``torch.mm`` TFLOP/s, each timed twice (the spread says what a difference in the tables means).

    python -m bench.gpu.ceilings            # writes ceilings.json and ceilings.md to $OUT
"""

from __future__ import annotations

import dataclasses
import json
import sys

from bench.gpu.common import device_name, measure_ceilings, out_dir, software


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here", file=sys.stderr)
        return 2
    runs = [measure_ceilings() for _ in range(2)]
    best = max(runs, key=lambda c: c.copy_tbs)
    best = dataclasses.replace(best, mm_tflops=max(c.mm_tflops for c in runs))
    (out_dir() / "ceilings.json").write_text(json.dumps(best.to_json()))
    lines = [
        f"device: {device_name()}; {software()}",
        *(
            f"run {i + 1}: copy {c.copy_tbs:.3f} TB/s, bf16 mm {c.mm_tflops:.0f} TFLOP/s"
            for i, c in enumerate(runs)
        ),
    ]
    (out_dir() / "ceilings.md").write_text("\n".join(f"- {line}" for line in lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
