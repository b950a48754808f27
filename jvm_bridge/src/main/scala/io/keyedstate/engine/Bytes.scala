package io.keyedstate.engine

import java.util.{Arrays, Objects}

import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.hash.Murmur3_x86_32

/** A byte-array key with value semantics, for hashing stored keys. */
final class Bytes(val bytes: Array[Byte]) {
  override val hashCode: Int = Bytes.hashOf(bytes)
  override def equals(other: Any): Boolean = other match {
    case b: Bytes => Arrays.equals(bytes, b.bytes)
    case _ => false
  }
}

object Bytes {
  /**
   * A key's hash: Murmur3 (x86, 32 bits, Spark's), the one [[BytesMap]]'s index keeps per entry
   * and the near cache's [[KeyFilter]] takes its bit positions from, so that a filter over a
   * cache's keys is filled from the index without reading a key. A polynomial hash (`Arrays`)
   * would not do for the filter: keys that differ like "Aa" and "BB" would share a hash, and so
   * every bit, for good.
   */
  def hashOf(key: Array[Byte]): Int = hashOf(key, 0, key.length)

  /** [[hashOf]] of `len` bytes of `a` from `from` (a key where it lies in a page). */
  def hashOf(a: Array[Byte], from: Int, len: Int): Int = {
    Objects.checkFromIndexSize(from, len, a.length) // it reads memory unchecked
    Murmur3_x86_32.hashUnsafeBytes2(a, Platform.BYTE_ARRAY_OFFSET + from, len, Seed)
  }

  private val Seed = 0x6b657973 // "keys"

  /** Whether `key` starts with `prefix` (scans by key prefix, in the cache and natively). */
  def startsWith(key: Array[Byte], prefix: Array[Byte]): Boolean =
    key.length >= prefix.length && Arrays.equals(key, 0, prefix.length, prefix, 0, prefix.length)
}
