"""The ``elasticps`` command line."""

from elasticps.cli.main import main

__all__ = ["main"]
