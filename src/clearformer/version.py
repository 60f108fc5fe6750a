"""The package version (a module of its own: the package root imports every public name for
type checkers, so modules that only need the version read it here without a cycle)."""

__version__ = "0.1.0"
