import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;

import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.BloomFilter;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksIterator;

/**
 * What the near cache's warm-up trades: a sequential scan of every entry against point reads of
 * some keys, through Spark's rocksdbjni, opened the way keyedstate's NativeReader opens a state
 * server's files (secondary instance, every file open, a 64 MiB LRU block cache, the files' Bloom
 * filter policy). Run by
 * benchmarks/read_cost.py: args = db dir, file of present keys, file of absent keys, key length.
 * Prints one JSON line per round.
 */
public final class NativeReadCost {
  public static void main(String[] args) throws Exception {
    RocksDB.loadLibrary();
    int keyLength = Integer.parseInt(args[3]);
    byte[] present = Files.readAllBytes(Paths.get(args[1]));
    byte[] absent = Files.readAllBytes(Paths.get(args[2]));
    Path secondary = Files.createTempDirectory("native-read-cost");
    Options options = new Options().setMaxOpenFiles(-1)
        .setTableFormatConfig(new BlockBasedTableConfig().setBlockCache(new LRUCache(64L << 20))
            .setFilterPolicy(new BloomFilter(10, false)));
    try (RocksDB db = RocksDB.openAsSecondary(options, args[0], secondary.toString())) {
      for (int round = 0; round < 3; round++) {
        long t0 = System.nanoTime();
        long entries = 0;
        try (RocksIterator it = db.newIterator()) {
          for (it.seekToFirst(); it.isValid(); it.next()) { it.key(); it.value(); entries++; }
        }
        long t1 = System.nanoTime();
        int found = reads(db, present, keyLength);
        long t2 = System.nanoTime();
        int foundAbsent = reads(db, absent, keyLength);
        long t3 = System.nanoTime();
        System.out.printf("{\"round\": %d, \"entries\": %d, \"scan_us_per_entry\": %.3f, \"present_reads\": %d, "
            + "\"present_found\": %d, \"read_present_us\": %.3f, \"absent_reads\": %d, \"absent_found\": %d, "
            + "\"read_absent_us\": %.3f}%n", round, entries, (t1 - t0) / 1e3 / entries,
            present.length / keyLength, found, (t2 - t1) / 1e3 / (present.length / keyLength),
            absent.length / keyLength, foundAbsent, (t3 - t2) / 1e3 / (absent.length / keyLength));
      }
    }
  }

  private static int reads(RocksDB db, byte[] keys, int keyLength) throws Exception {
    int found = 0;
    for (int i = 0; i + keyLength <= keys.length; i += keyLength) {
      if (db.get(Arrays.copyOfRange(keys, i, i + keyLength)) != null) found++;
    }
    return found;
  }
}
