package io.keyedstate.offline

import io.keyedstate.checkpoint.{CheckpointFiles, Listing}

/**
 * The rescales the state data source's readers meet, from the partition's own snapshot
 * manifests (their `rescale` object, FORMATS.md). Spark plans a read's partitions by the partition
 * count of its last batch, so every partition a reader opens exists at that batch and holds the
 * snapshot of each rescale it went through since (a retired partition is never opened). A
 * partition's state before a rescale belongs to the old partitioning: no read starts there and
 * runs through it.
 */
object Rescales {
  /** The rescales at versions `from..to` of the partition, oldest first. A version with a
   *  changelog is a query's commit, so only snapshot versions without one are read. */
  def within(files: CheckpointFiles, listing: Listing, from: Long, to: Long): Seq[Rescale] =
    listing.snapshotFiles.toSeq.sorted
      .filter { case (v, _) => v >= from && v <= to && !listing.changelogs.contains(v) }
      .flatMap { case (v, id) =>
        files.readManifest(v, id).rescale.map { r =>
          Rescale(v, r.path("fromPartitions").asInt(-1), r.path("toPartitions").asInt(-1))
        }
      }

  /** The one-line refusal of a read that starts at batch `startBatch` (its option `option`)
   *  before rescale `r`. */
  def refuseSpanning(option: String, startBatch: Long, r: Rescale, describe: String, why: String): Nothing =
    throw new IllegalArgumentException(s"keyedstate: $option $startBatch is before batch ${r.batch}, which " +
      s"rescaled the operator to ${r.toPartitions} partitions (from ${r.fromPartitions}): $why; start at " +
      s"$option ${r.batch} or later ($describe)")
}
