"""keyedstate's version: the package root, the command line, the conf check and the jar's
manifest all read it here (a module that imports nothing, so every layer may)."""
from __future__ import annotations

__version__ = "0.1.0"
