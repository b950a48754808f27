"""``python -m keyedstate.server``: how the JVM shim starts a state server."""
from .api import main

main()
