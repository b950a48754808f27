package io.keyedstate.offline

/** Version `version` (batch `version - 1`, Spark's repartition batch) of a store partition was
 *  written by `keyedstate rescale`: its keys redistributed over `toPartitions` partitions, no
 *  value changed, and no changelog written. */
final case class Rescale(version: Long, fromPartitions: Int, toPartitions: Int) {
  def batch: Long = version - 1
}
