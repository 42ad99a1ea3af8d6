"""The package version, in a module of its own so any module can read it without
importing the package ``__init__`` (arrows run down)."""

__version__ = "0.1.0"
