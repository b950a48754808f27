package io.keyedstate.engine

import io.keyedstate.format.{KeyCodec, TtlScan}

/**
 * Incremental TTL cleanup, part of a commit. Every `cleanupInterval` versions, after the apply,
 * the state server walks a bounded number of entries (in the background) and remembers the
 * expired ones; a later commit deletes them through its changelog, so every reload and every
 * executor agrees on the state. A commit never waits for a scan: it takes the last finished one.
 * Keys scanned in exactly the version it commits on cannot have changed except through this
 * version's own writes; keys from an older scan are checked again against the committed values.
 * For a join's index store the rows found are only candidates: a row is garbage when the join
 * key's count, in the sibling count store committed just before in the same task, is gone,
 * expired or no longer covers the row's index.
 */
final class TtlCleanup(engine: StoreEngine, policy: TtlPolicy, codec: () => KeyCodec, describe: String) {

  /** What the server should scan for after applying a version committed at `nowMs`. */
  def scanRequest(nowMs: Long): Option[TtlScan] =
    if (policy.enabled) Some(TtlScan(nowMs - policy.ttlMs, policy.cleanupInterval, policy.cleanupKeysPerScan)) else None

  /** Adds the deletes of expired entries to `view`'s buffer; returns (entries deleted, ms). */
  def collect(session: ServerSession, view: BufferedVersion, newVersion: Long, nowMs: Long): (Long, Long) = {
    if (!policy.enabled) return (0L, 0L)
    val started = System.nanoTime()
    val found = session.data(s"fetching TTL cleanup candidates of $describe")((c, h) => c.ttlCandidates(h))
    if (found.version < 0 || found.version > view.version || found.keys.isEmpty) return (0L, found.scanMs.toLong)
    val expireBefore = nowMs - policy.ttlMs
    val buffer = view.buffer
    val keys = found.keys.map(new Bytes(_)).filter(buffer.lookup(_) == null)
    // Still there, and (per-entry TTL) still expired, in the version this commit builds on?
    val current: Array[Array[Byte]] = if (found.version == view.version) null else view.committed.getMany(keys)
    def stillExpired(i: Int): Boolean = current == null ||
      (current(i) != null && (!policy.perEntry || policy.isExpired(current(i), expireBefore)))
    val isGarbage: Array[Byte] => Boolean = policy.countStore match {
      case None => _ => true
      case Some(countStoreName) =>
        val sibling = OpenStores.sibling(engine, engine.id.copy(storeName = countStoreName)).getOrElse(return (0L, found.scanMs.toLong))
        val indexCodec = codec()
        key => {
          val (countKey, index) = indexCodec.countKeyAndIndex(key)
          sibling.committedValue(new Bytes(countKey), newVersion) match {
            case None => return (0L, found.scanMs.toLong) // the count store is elsewhere: next time
            case Some(null) => true
            case Some(count) =>
              policy.isExpired(count, expireBefore) || sibling.codec.decodeValue(count).getLong(0) <= index
          }
        }
    }
    var cleaned = 0L
    var i = 0
    while (i < keys.length) {
      if (stillExpired(i) && isGarbage(keys(i).bytes)) {
        view.committed.learned.put(keys(i), java.lang.Boolean.TRUE) // it exists: logged as an exact delete
        view.delete(keys(i))
        cleaned += 1
      }
      i += 1
    }
    (cleaned, found.scanMs + (System.nanoTime() - started) / 1000000)
  }
}
