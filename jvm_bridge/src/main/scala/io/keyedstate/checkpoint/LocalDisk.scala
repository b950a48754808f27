package io.keyedstate.checkpoint

import java.io.IOException

import org.apache.hadoop.fs.Path

import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, CheckpointLayout, CorruptChangelogException,
  CorruptManifestException, ManifestFormat, SnapshotFile, SnapshotManifest, UnsafePathException}

/** Failures of keyedstate's local working files, named as such (never as a checkpoint problem). */
object LocalDisk {
  def failed(path: java.nio.file.Path, e: IOException): LocalDiskException = {
    val full = Option(e.getMessage).exists(_.contains("No space left"))
    new LocalDiskException(s"keyedstate: cannot write $path on the executor's local disk" +
      (if (full) " (the local disk is full; the checkpoint is fine: free space and the task's retry continues)"
      else s" (${e.getMessage}); the checkpoint is not affected"), e)
  }
}
