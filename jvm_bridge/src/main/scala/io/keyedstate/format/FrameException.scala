package io.keyedstate.format

/** A frame whose lengths or fields do not fit. */
class FrameException(message: String) extends IllegalStateException(message)
