package io.keyedstate.format

/** A changelog is truncated, corrupt or foreign; the message names it. */
class CorruptChangelogException(message: String) extends IllegalArgumentException(message)
