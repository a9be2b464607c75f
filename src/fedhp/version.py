"""fedhp's version, in one place below every module that reads it (``fedhp.__version__``,
``fedhp --version`` from a source tree, the Flower node cache's digest)."""

__version__ = "0.1.0"
