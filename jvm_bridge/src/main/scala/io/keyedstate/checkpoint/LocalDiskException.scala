package io.keyedstate.checkpoint

import java.io.IOException

import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, CheckpointLayout, CorruptChangelogException,
  CorruptManifestException, ManifestFormat, SnapshotFile, SnapshotManifest, UnsafePathException}

/** The local disk (not the checkpoint) failed, e.g. it is full; the message says where. */
class LocalDiskException(message: String, cause: Throwable = null) extends IOException(message, cause)
