package io.keyedstate.format

final case class TtlCandidates(version: Long, scanMs: Int, keys: Array[Array[Byte]])
