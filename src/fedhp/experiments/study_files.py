"""What a study (``dp``, ``robust``, ``fedlps-*``, ``fnrfl-table2``, ``leaf-shakespeare``) leaves
in its output folder, ``table.md`` and ``table.json``, and the line it prints per result."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedhp.experiments.common import ReproOptions
from fedhp.reporting import write_json_atomic


def write_study(
    opts: ReproOptions, out: Path, head: str, text: str, result: dict[str, Any]
) -> dict[str, Any]:
    """``out/table.md`` (``head``, a blank line, the tables ``text``) and ``out/table.json``
    (``result``); ``text`` on stderr unless ``--quiet``. Returns ``result``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(f"{head}\n\n{text}")
    write_json_atomic(out / "table.json", result)
    if not opts.quiet:
        print(text, file=sys.stderr)
    return result


def print_result(words: str, row: Mapping[str, Any], formats: Mapping[str, str]) -> None:
    """Print one result line, flushed: ``words``, then ``key=<mean over seeds>`` for each key of
    ``formats`` (``row[key]["mean"]`` in that key's format spec)."""
    means = " ".join(f"{key}={row[key]['mean']:{spec}}" for key, spec in formats.items())
    print(f"{words} {means}", flush=True)
