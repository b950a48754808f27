package io.keyedstate.bridge

/** The state server process died; the task fails and its retry starts a new server. */
class StateServerDiedException(message: String, cause: Throwable = null)
  extends RuntimeException(message, cause)
