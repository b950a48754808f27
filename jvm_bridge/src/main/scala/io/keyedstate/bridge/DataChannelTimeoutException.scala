package io.keyedstate.bridge

import java.io.IOException

/** An exchange on the data channel took longer than the bridge timeout (the channel is closed). */
final class DataChannelTimeoutException(val timeoutMs: Long)
  extends IOException(s"no answer on the data channel within $timeoutMs ms")
