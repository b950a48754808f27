package io.keyedstate.format

/** Every `interval` versions, after applying, look for up to `budget` entries written at or
 *  before `expireBefore` (epoch ms). */
final case class TtlScan(expireBefore: Long, interval: Int, budget: Int)
