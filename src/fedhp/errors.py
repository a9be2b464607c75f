"""User-facing errors: each carries a one-line message naming the field and the fix."""

from __future__ import annotations


class FedhpError(Exception):
    """An error caused by the user's input or environment, shown as one line (exit code 2)."""

    exit_code = 2


class ConfigError(FedhpError):
    """A configuration value is unknown, of the wrong type or out of range."""


class DatasetError(FedhpError):
    """A dataset is missing, corrupt, or cannot satisfy the requested partition."""


class DivergenceError(FedhpError):
    """Training produced NaN/Inf or an exploding loss."""

    exit_code = 3
