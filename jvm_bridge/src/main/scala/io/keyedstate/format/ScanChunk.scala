package io.keyedstate.format

final case class ScanChunk(keys: Array[Array[Byte]], values: Array[Array[Byte]], hasMore: Boolean)
