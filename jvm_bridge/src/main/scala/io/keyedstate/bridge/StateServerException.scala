package io.keyedstate.bridge

/** The state server refused a request (bad conf, corrupt checkpoint file, ...). */
class StateServerException(message: String, cause: Throwable = null)
  extends RuntimeException(message, cause)
