package io.keyedstate.testing;

import java.io.OutputStream;
import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;

/**
 * Writes, lists, reads and deletes checkpoint files in a {@code file:} directory with a fresh
 * Hadoop conf (Hadoop's own local file system), in one of two ways: {@code keyedstate} through
 * keyedstate's CheckpointFiles (by reflection: this jar is compiled without the shim), or
 * {@code spark} through Spark's CheckpointFileManager as Spark's own providers write. Run by
 * tests/jvm/test_forkless_local_fs.py with {@code chmod}, {@code readlink}, {@code stat} and {@code ls}
 * on its PATH logging each call, to count the processes each way starts. Args: way, directory.
 */
public final class LocalCheckpointWrites {
  public static void main(String[] args) throws Exception {
    String way = args[0];
    Path dir = new Path(Paths.get(args[1]).toUri());
    Configuration conf = new Configuration();
    byte[] data = "a checkpoint file".getBytes(StandardCharsets.UTF_8);
    if (way.equals("keyedstate")) {
      Class<?> files = Class.forName("io.keyedstate.checkpoint.CheckpointFiles");
      Constructor<?> make = files.getConstructor(Path.class, Configuration.class);
      Object store = make.newInstance(dir, conf);
      files.getMethod("ensureDirs").invoke(store);
      Method createOnce = files.getMethod("createOnce", Path.class, ByteBuffer.class, boolean.class);
      for (int v = 1; v <= 3; v++) {
        Path changelog = (Path) files.getMethod("changelog", long.class, scala.Option.class)
            .invoke(store, (long) v, scala.Option.empty());
        createOnce.invoke(store, changelog, ByteBuffer.wrap(data), true);
      }
      java.nio.file.Path local = Files.createTempFile("keyedstate-upload", ".sst");
      Files.write(local, data);
      Object named = files.getMethod("newSnapshotFilePath", String.class).invoke(store, "000001.sst");
      Path snapshotFile = (Path) ((scala.Tuple2<?, ?>) named)._2();
      files.getMethod("upload", java.nio.file.Path.class, Path.class).invoke(store, local, snapshotFile);
      files.getMethod("listing").invoke(store);
      java.nio.file.Path back = Files.createTempFile("keyedstate-download", ".sst");
      Files.delete(back);
      files.getMethod("download", Path.class, java.nio.file.Path.class).invoke(store, snapshotFile, back);
      files.getMethod("delete", Path.class).invoke(store, snapshotFile);
      Files.delete(local);
      Files.delete(back);
    } else if (way.equals("spark")) {
      CheckpointFileManager fm = CheckpointFileManager.create(dir, conf);
      fm.mkdirs(dir);
      for (int v = 1; v <= 3; v++) {
        try (OutputStream out = fm.createAtomic(new Path(dir, v + ".changelog"), false)) {
          out.write(data);
        }
      }
    } else {
      throw new IllegalArgumentException("way: keyedstate or spark, not " + way);
    }
    System.out.println("DONE");
  }
}
