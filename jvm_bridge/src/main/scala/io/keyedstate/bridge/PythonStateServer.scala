package io.keyedstate.bridge

/**
 * Control calls into the Python state server, implemented in Python
 * (`keyedstate.server.StateServerApi`) and reached as a py4j callback proxy.
 * Only control traffic goes here: a few calls per store per micro-batch. Keys, values and
 * changelogs travel over the [[DataChannel]].
 */
trait PythonStateServer {
  /** Validates the keyedstate confs (JSON object) and opens a store; returns JSON settings. */
  def openStore(name: String, confsJson: String): String
  /** Resets a store to `version`, from a downloaded snapshot dir or empty (dir = null). */
  def restore(handle: Int, version: Long, snapshotDir: String, lineage: String, numKeys: Long): Unit
  /** Replays downloaded changelogs, a JSON list of [version, localPath, checkpointPath], in order. */
  def replay(handle: Int, changelogsJson: String): Unit
  def stageSnapshot(handle: Int): Unit
  /** Staged local snapshots waiting for upload, as JSON: once version `through`'s is staged
   *  (or nothing is pending); with `through` = -1 what is staged now. */
  def stagedSnapshots(handle: Int, through: Long): String
  def dropStaged(handle: Int, version: Long): Unit
  /** Version and exact key count, once pending write-behind applies are done (JSON). */
  def storeInfo(handle: Int): String
  /** RocksDB memory of the store, without waiting for pending applies. */
  def memoryBytes(handle: Int): String
  /** RocksDB memory of the whole process (its pool under a memoryBudget). */
  def processMemoryBytes(): String
  def closeStore(handle: Int): Unit
  def dataSocketPath(): String
}
