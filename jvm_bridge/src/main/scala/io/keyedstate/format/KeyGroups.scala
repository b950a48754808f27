package io.keyedstate.format

/**
 * Key groups (Flink's KeyGroupRangeAssignment): the only place the key -> key group -> partition
 * arithmetic lives on the JVM side (the offline tools' twin is `keyedstate/formats/keygroups.py`).
 * Spark sends a key to partition pmod(hash, partitions); keyedstate stores it under key group
 * pmod(hash, keyGroups). When the partition count divides the key-group count, hash mod
 * partitions == key group mod partitions: a partition owns whole key groups.
 */
object KeyGroups {
  def keyGroupOf(sparkHash: Int, keyGroups: Int): Int = {
    require(keyGroups > 0, s"keyGroups must be positive, got $keyGroups")
    Math.floorMod(sparkHash, keyGroups)
  }

  def divides(partitions: Int, keyGroups: Int): Boolean = partitions >= 1 && keyGroups % partitions == 0

  /** The partition owning `keyGroup`; defined only when the partitions divide the key groups. */
  def partitionOf(keyGroup: Int, keyGroups: Int, partitions: Int): Int = {
    require(divides(partitions, keyGroups), s"$partitions partitions do not divide $keyGroups key groups")
    require(keyGroup >= 0 && keyGroup < keyGroups, s"key group $keyGroup is not in [0, $keyGroups)")
    keyGroup % partitions
  }
}
