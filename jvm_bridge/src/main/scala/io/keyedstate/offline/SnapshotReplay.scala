package io.keyedstate.offline

import io.keyedstate.checkpoint.CheckpointFileException
import io.keyedstate.engine.StoreEngine

/**
 * The state data source's `snapshotStartBatchId`/`snapshotPartitionId`: Spark asks for the state
 * of `endVersion` "rebuilt from the snapshot of `snapshotVersion` plus the changelogs after it",
 * and, like Spark's RocksDB provider, keyedstate refuses a version that has no snapshot (naming
 * the versions that have one) or whose manifest is unreadable. The version is then loaded the
 * way every load is ([[io.keyedstate.engine.VersionLoader]]: the newest usable snapshot at or
 * below it, plus changelogs): its content does not depend on the snapshot it starts from, and a
 * corrupt newer snapshot is skipped by the loader in favour of an older one in any case.
 * A snapshot before a rescale between it and `endVersion` ([[Rescales]]) is refused: the
 * partition's later state does not derive from it.
 */
object SnapshotReplay {
  def check(engine: StoreEngine, snapshotVersion: Long, endVersion: Long, snapshotId: Option[String]): Unit = {
    if (snapshotVersion < 1 || endVersion < snapshotVersion) {
      throw new IllegalArgumentException(s"keyedstate: cannot replay ${engine.describe} from snapshot version " +
        s"$snapshotVersion to version $endVersion: snapshotStartBatchId must be >= 0 and <= batchId")
    }
    val listing = engine.files.listing()
    Rescales.within(engine.files, listing, snapshotVersion + 1, endVersion).lastOption.foreach { r =>
      Rescales.refuseSpanning("snapshotStartBatchId", snapshotVersion - 1, r, engine.describe,
        s"partition ${engine.id.partitionId}'s state after it is not rebuilt from a snapshot before it")
    }
    val matching = listing.snapshotFiles.filter { case (v, id) => v == snapshotVersion && (snapshotId.isEmpty || id == snapshotId) }
    if (matching.isEmpty) {
      val have = listing.snapshots.toSeq.map(_ - 1)
      throw new CheckpointFileException(s"keyedstate: ${engine.describe} has no snapshot of version $snapshotVersion " +
        s"(snapshotStartBatchId ${snapshotVersion - 1}) in ${engine.files.dir}; batches with a snapshot: " +
        s"${if (have.isEmpty) "none yet" else have.mkString(", ")}")
    }
    engine.files.readManifest(snapshotVersion, matching.head._2) // refuses a corrupt or tampered manifest
  }
}
