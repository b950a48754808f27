package io.keyedstate.engine

import io.keyedstate.format.KeyCodec

/**
 * Time to live over a version (Flink's TtlValueState): values written carry the write time, an
 * expired entry is hidden from reads and scans (unless the policy returns it until cleanup), and
 * with OnReadAndWrite a point read writes the entry again with a new time. Scans never refresh a
 * TTL: Spark's operators scan all state for watermarks and timeouts.
 */
final class TtlView(inner: KeyValueView, policy: TtlPolicy, nowMs: Long, writable: () => Boolean) extends KeyValueView {
  private val expireBefore = policy.expireBefore(nowMs)
  /** Expired entries hidden from (or, per the policy, returned to) reads and scans. */
  var expiredSeen = 0L

  private def expired(stored: Array[Byte]): Boolean = policy.perEntry && policy.isExpired(stored, expireBefore)

  override def get(key: Bytes): Array[Byte] = {
    val stored = inner.get(key)
    if (stored == null) null
    else if (expired(stored)) {
      expiredSeen += 1
      if (policy.returnExpired) stored else null
    } else {
      if (policy.refreshesOnRead(stored, nowMs) && writable()) inner.put(key, KeyCodec.withWriteTime(stored, nowMs))
      stored
    }
  }

  // Join index rows carry a write time too: it tells cleanup which rows may have outlived their
  // count (a row is never older than its count's last write).
  override def put(key: Bytes, value: Array[Byte]): Unit =
    inner.put(key, if (policy.enabled) KeyCodec.withWriteTime(value, nowMs) else value)

  override def delete(key: Bytes): Unit = inner.delete(key)

  override def scan(prefix: Array[Byte]): Iterator[(Array[Byte], Array[Byte])] =
    if (!policy.perEntry || policy.returnExpired) inner.scan(prefix)
    else inner.scan(prefix).filter { case (_, v) => if (expired(v)) { expiredSeen += 1; false } else true }
}
