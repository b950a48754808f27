package io.keyedstate.bridge

import java.nio.file.{Files, Path}

/** keyedstate's local working files (state server directories, downloads, native readers). */
object LocalFiles {
  def deleteTree(path: Path): Unit =
    if (Files.exists(path)) {
      val stream = Files.walk(path)
      try stream.sorted(java.util.Comparator.reverseOrder()).forEach(p => Files.deleteIfExists(p))
      finally stream.close()
    }
}
