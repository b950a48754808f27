package io.keyedstate.testing;

import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * The JVM side of the reader fuzzer (tests/fuzz.py), run in a child JVM with a small heap so
 * that an over-allocation shows as an OutOfMemoryError. Reads inputs from stdin, each
 * {@code u8 reader | u32 name length | name | u32 data length | data}, feeds each to keyedstate's
 * reader of that file kind under that name, and prints READY, then one line per input: {@code OK},
 * {@code ERR <class> <message>}, or {@code FATAL <class> <message>} for an Error (then exits).
 * keyedstate's classes are called by reflection: this jar is compiled without the shim.
 * Readers: 0 changelog (framing, then every record), 1 snapshot manifest, 2 Spark's offsets
 * file (written to the name, a path), 3 Spark's operator metadata (written to the name, a path
 * ending in state/0/_metadata/metadata).
 */
public final class ReaderFuzz {
  public static void main(String[] args) throws Exception {
    Method readChangelog = Class.forName("io.keyedstate.format.ChangelogFormat")
        .getMethod("read", byte[].class, String.class);
    Method decodeManifest = Class.forName("io.keyedstate.format.ManifestFormat")
        .getMethod("decode", byte[].class, String.class, long.class);
    Class<?> sparkMetadata = Class.forName("io.keyedstate.engine.SparkMetadata");
    Method batchTimestamp = sparkMetadata.getMethod("batchTimestamp", Path.class, long.class, Configuration.class);
    Method operators = sparkMetadata.getMethod("operators", Path.class, Configuration.class);
    Configuration conf = new Configuration();
    // as in the suite's Spark session: local files without Hadoop's child processes
    conf.set("fs.file.impl", "io.keyedstate.checkpoint.ForklessLocalFileSystem"); // keyedstate's jar
    org.apache.hadoop.fs.FileSystem.getLocal(conf); // started before READY, not in the first input's time
    DataInputStream in = new DataInputStream(System.in);
    PrintStream out = new PrintStream(new BufferedOutputStream(System.out), false, StandardCharsets.UTF_8);
    out.println("READY");
    out.flush();
    while (true) {
      int reader;
      try {
        reader = in.readUnsignedByte();
      } catch (EOFException e) {
        break;
      }
      byte[] nameBytes = new byte[in.readInt()];
      in.readFully(nameBytes);
      String name = new String(nameBytes, StandardCharsets.UTF_8);
      byte[] data = new byte[in.readInt()];
      in.readFully(data);
      try {
        switch (reader) {
          case 0: {
            Object log = readChangelog.invoke(null, data, name);
            scala.collection.Iterator<?> records =
                (scala.collection.Iterator<?>) log.getClass().getMethod("iterator").invoke(log);
            while (records.hasNext()) records.next();
            break;
          }
          case 1:
            decodeManifest.invoke(null, data, name, -1L);
            break;
          case 2: {
            java.nio.file.Path file = Paths.get(name);
            Files.write(file, data);
            batchTimestamp.invoke(null, new Path(file.getParent().getParent().toUri()),
                Long.parseLong(file.getFileName().toString()), conf);
            break;
          }
          case 3: {
            java.nio.file.Path file = Paths.get(name);
            Files.write(file, data);
            operators.invoke(null, new Path(file.getParent().getParent().getParent().toUri()), conf);
            break;
          }
          default:
            throw new IllegalArgumentException("unknown reader " + reader);
        }
        out.println("OK");
      } catch (Throwable t) {
        Throwable e = t instanceof InvocationTargetException ? t.getCause() : t;
        String message = String.valueOf(e.getMessage()).replace('\n', ' ').replace('\r', ' ');
        if (e instanceof Error) {
          out.println("FATAL\t" + e.getClass().getName() + "\t" + message);
          out.flush();
          System.exit(3);
        }
        out.println("ERR\t" + e.getClass().getName() + "\t" + message);
      }
      out.flush();
    }
    out.flush();
  }
}
