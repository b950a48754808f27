package io.keyedstate.engine

import io.keyedstate.format.ScanChunk

/** Round trips to the state server over the data channel. */
final class ServerReads(session: ServerSession, chunkBytes: () => Int, describe: String) extends CommittedReads {
  override def get(key: Bytes): Array[Byte] = session.data(s"reading $describe")((c, h) => c.get(h, key.bytes))
  override def getMany(keys: Array[Bytes]): Array[Array[Byte]] =
    session.data(s"reading $describe")((c, h) => c.multiGet(h, keys.map(_.bytes)))
  override def scan(prefix: Array[Byte], startAfter: Array[Byte], keysOnly: Boolean): ScanChunk =
    session.data(s"scanning $describe")((c, h) => c.scan(h, prefix, startAfter, chunkBytes(), keysOnly))
}
