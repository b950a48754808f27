package io.keyedstate.engine

final case class CacheCounters(hits: Long, absent: Long, misses: Long, evictions: Long)
