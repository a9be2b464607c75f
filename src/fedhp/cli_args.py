"""The command line's ``[CONFIG] [key=value ...]``: declared and read the same way by ``fedhp run``,
``fedhp sweep`` and ``fedhp flower app|deploy``.

It sits below the commands that share it (:mod:`fedhp.cli`, :mod:`fedhp.sweep.cli`,
:mod:`fedhp.flower.deploy_cli`), so that none of them imports another to read its arguments.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedhp.errors import FedhpWarning

ITEMS = "[CONFIG] [key=value ...]"
"""How the help names the positional arguments."""


def add_items(parser: Any) -> None:
    """Add the positional ``[CONFIG] [key=value ...]`` (``args.items``) to ``parser``."""
    parser.add_argument("items", nargs="*", metavar=ITEMS)


def split_positionals(items: Sequence[str]) -> tuple[Path | None, list[str]]:
    """``[CONFIG] [key=value ...]``: the config file (if the first item has no ``=``) and the
    overrides (a key given twice: a warning line, the later value is used)."""

    config: Path | None = None
    overrides: list[str] = []
    for i, item in enumerate(items):
        if i == 0 and "=" not in item:
            config = Path(item)
        else:
            overrides.append(item)
    warn_repeated(overrides)
    return config, overrides


def warn_repeated(overrides: Sequence[str]) -> None:
    """A warning line for each key the overrides give twice (the later value is used)."""
    from fedhp.config import repeated_overrides

    for note in repeated_overrides(overrides):
        warnings.warn(note, FedhpWarning, stacklevel=2)
