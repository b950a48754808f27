package io.keyedstate.engine

import java.util.Arrays

/** A byte-array key with value semantics, for hashing stored keys. */
final class Bytes(val bytes: Array[Byte]) {
  override val hashCode: Int = Arrays.hashCode(bytes)
  override def equals(other: Any): Boolean = other match {
    case b: Bytes => Arrays.equals(bytes, b.bytes)
    case _ => false
  }
}

object Bytes {
  /** Whether `key` starts with `prefix` (scans by key prefix, in the cache and natively). */
  def startsWith(key: Array[Byte], prefix: Array[Byte]): Boolean =
    key.length >= prefix.length && Arrays.equals(key, 0, prefix.length, prefix, 0, prefix.length)
}
