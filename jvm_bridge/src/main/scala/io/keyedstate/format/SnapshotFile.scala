package io.keyedstate.format

final case class SnapshotFile(name: String, path: String, size: Long)
