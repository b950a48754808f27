package io.keyedstate.format

/** How a store lays out its keys ([[KeyCodec]]): recorded so offline tools never guess it. */
final case class KeyLayout(keyColumns: Int, partitionKeyColumns: Int, prefixColumns: Int)
