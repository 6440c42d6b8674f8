"""The package's version, in a module of its own that imports nothing.

Everything that shows the version (`tt-agent --version`, `GET /agent/info`,
the packaging metadata, `agent.__version__`) reads it from here, so no module
has to import the `agent` package itself for it: that import would tie every
such module into a cycle with the package's `__init__`.
"""

__version__ = "0.2.0"
