"""User-facing errors: each carries a one-line message naming the field and the fix.

Exit codes of the ``fedhp`` command: 0 done; 1 a Flower deployment's run failed; 2 bad input
(:class:`FedhpError`: configuration, data, paths, arguments); 3 the run diverged
(:class:`DivergenceError`: the input was valid, the training blew up; results up to the last good
round are kept); 130 interrupted (Ctrl-C; ``fedhp run --resume DIR`` continues).
"""

from __future__ import annotations


class FedhpError(Exception):
    """An error caused by the user's input or environment, shown as one line (exit code 2)."""

    exit_code = 2


class ConfigError(FedhpError):
    """A configuration value is unknown, of the wrong type or out of range."""


class DatasetError(FedhpError):
    """A dataset is missing, corrupt, or cannot satisfy the requested partition."""


class DivergenceError(FedhpError):
    """Training produced NaN/Inf or an exploding loss (exit code 3: the input was valid)."""

    exit_code = 3


class FedhpWarning(UserWarning):
    """Input that runs, though perhaps not as meant; ``fedhp`` shows it as one line
    (``fedhp: warning: ...``) and goes on."""
