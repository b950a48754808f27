"""keyedstate's byte formats, one module per format, each the Python half of a spec in FORMATS.md.

The JVM shim writes what these modules read (changelogs, manifests, frames, stored keys and
values) and golden files in ``tests/golden/`` hold both languages to the same bytes. Nothing
here depends on the state server or the offline tools; both depend on this.
"""
