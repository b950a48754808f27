package io.keyedstate.engine

/** A clock a test sets by hand. */
final class ManualClock(@volatile var nowMs: Long) extends TtlClock {
  override def now(version: Long): Long = nowMs
  def set(ms: Long): Unit = nowMs = ms
  def advance(ms: Long): Unit = nowMs += ms
}
