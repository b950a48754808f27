package io.keyedstate.engine

/** A snapshot cannot be used; an older one and the changelogs after it may be. */
final class SnapshotUnusable(message: String) extends RuntimeException(message)
