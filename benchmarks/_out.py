"""Where the benchmark scripts write their JSON results, and the machine they ran on.

Synthetic data comes from :mod:`packer.measure.bench.synth`, timing from :mod:`packer.measure.timing`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def machine() -> dict[str, Any]:
    """Cores, CPU, Python, torch, date and (when present) the GPU: ``imgpack bench``'s record."""
    from packer.measure.bench import machine_info
    from packer.measure.timing import resolve_device

    return machine_info(resolve_device("auto"))


def dump(obj: object, name: str) -> None:
    """Write ``obj`` as ``$OUT/name`` (default ``./out/name``), whole or not at all."""
    from packer.pack.files import write_json_atomic

    out = Path(os.environ.get("OUT", ROOT / "out"))
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / name, obj, indent=1)
