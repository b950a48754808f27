package io.keyedstate.checkpoint

import io.keyedstate.format.{ChangelogFormat, ChangelogMeta, CheckpointLayout, CorruptChangelogException,
  CorruptManifestException, ManifestFormat, SnapshotFile, SnapshotManifest, UnsafePathException}

/** A checkpoint file is unreadable, foreign or missing; the message names it. */
class CheckpointFileException(message: String, cause: Throwable = null)
  extends RuntimeException(message, cause)
