"""``python -m keyedstate.server``: how the JVM shim starts a state server."""
from .main import main

main()
