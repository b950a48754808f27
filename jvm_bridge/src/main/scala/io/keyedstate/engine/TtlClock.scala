package io.keyedstate.engine

/** "Now" for TTL, per version: injected into the engine (Flink's TtlTimeProvider). */
trait TtlClock {
  /** The time of the batch that writes version `version + 1` on top of `version`, epoch ms. */
  def now(version: Long): Long
}
