package io.keyedstate.format

/** A checkpoint file names a path outside the directories keyedstate may touch. */
class UnsafePathException(message: String) extends IllegalArgumentException(message)
