"""A run function for map_runs tests: records its process id, then sleeps (spawn-importable)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def sleepy(overrides: list[str], folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pid").write_text(str(os.getpid()))
    time.sleep(float(overrides[0]))
    return os.getpid()
