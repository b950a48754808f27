package io.keyedstate.engine

/**
 * One store version's entries as a task sees them, in stored bytes. Two layers share this
 * interface: [[TtlView]] (expiry and write times) over [[BufferedVersion]] (the version's own
 * writes over the committed version). The Spark-facing store encodes rows above them.
 */
trait KeyValueView {
  /** The stored value visible in this version, or null. */
  def get(key: Bytes): Array[Byte]
  def put(key: Bytes, value: Array[Byte]): Unit
  def delete(key: Bytes): Unit
  /** Entries with `prefix`, in no promised order; tolerates writes while it runs. */
  def scan(prefix: Array[Byte]): Iterator[(Array[Byte], Array[Byte])]
}
