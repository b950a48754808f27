package io.keyedstate.format

/** A manifest is truncated, corrupt or foreign; the message names it. */
class CorruptManifestException(message: String, cause: Throwable = null)
  extends IllegalArgumentException(message, cause)
