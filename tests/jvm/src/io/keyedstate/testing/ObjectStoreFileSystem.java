package io.keyedstate.testing;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.OutputStream;
import java.io.RandomAccessFile;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Properties;
import java.util.Random;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSInputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.ParentNotDirectoryException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.PathIsNotEmptyDirectoryException;
import org.apache.hadoop.fs.StreamCapabilities;
import org.apache.hadoop.fs.Syncable;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;

/**
 * A Hadoop FileSystem for tests that behaves like an object store (S3 through s3a) and can be
 * told to fail. Checkpoint code that is correct on HDFS or a local disk can be wrong on S3; this
 * makes those differences show up in a local test instead of in production.
 *
 * <p>{@code objtest://bucket/key} is stored as the local file {@code <root>/bucket/key}. The root
 * comes from the Hadoop conf {@code fs.objtest.root} (with Spark: {@code spark.hadoop.fs.objtest.root},
 * which reaches executors too), else the system property {@code objtest.root}, else the
 * environment variable {@code OBJTEST_ROOT}. Register with {@code fs.objtest.impl}. There is no
 * AbstractFileSystem binding on purpose: Spark's CheckpointFileManager.create then falls back to
 * FileSystemBasedCheckpointFileManager, the one Spark uses for s3a.
 *
 * <p>Object-store semantics, and where they differ from HDFS:
 * <ul>
 * <li>No directories. {@code mkdirs} succeeds and creates nothing; a directory exists while some
 *   object has its prefix; listings synthesise directories from prefixes; listing or getting the
 *   status of a prefix with no objects is FileNotFoundException. (Real s3a writes an empty
 *   "dir/" marker object on mkdirs; {@code dirMarkers=true} emulates that.)</li>
 * <li>An object appears whole on {@code close()} of its output stream and never before (an S3 PUT):
 *   bytes go to a hidden temp file first. hflush/hsync publish nothing. A stream whose write failed
 *   publishes nothing.</li>
 * <li>{@code rename} = copy each object, then delete the sources; not atomic. {@code rename.delayMs}
 *   sleeps between the two phases so a test can observe or race the window in which both exist.
 *   Renaming a file onto an existing file follows {@code rename.existing}: {@code fail} (default,
 *   what s3a does: FileAlreadyExistsException, decided by a check before the copy, so two racing
 *   renames can both "win"), {@code overwrite} (the copy replaces it, like a raw S3 CopyObject or
 *   a POSIX rename) or {@code false} (return false, like HDFS). A directory is renamed only onto a
 *   missing or empty path; onto a non-empty one it returns false.</li>
 * <li>{@code delete} of a prefix deletes every object under it, one by one.</li>
 * <li>Reads and listings are strongly consistent (as S3 has been since 2020).</li>
 * <li>Limitation of the local backing: an object cannot be stored under another object's key
 *   ({@code a/b} and {@code a/b/c}): ParentNotDirectoryException.</li>
 * </ul>
 *
 * <p>Faults and dynamic settings come from the control file {@code <root>/.objtest/control}, a
 * Java properties file. Every JVM (driver, executors) re-reads it when its inode, mtime or size
 * changed, checked with one stat on each create, rename, open, listStatus, delete and mkdirs
 * (open streams use the rules of the latest such call), so a test arms faults for the whole
 * cluster by rewriting that file atomically. Each rewrite starts a new arming: per-JVM call
 * counters, the disk-full byte count and the random generator restart. Keys ({@code <op>} is create, rename, open, listStatus, delete or hsync):
 * <pre>
 * &lt;op&gt;.nth=N           fail the N-th matching call after arming (1-based) ...
 * &lt;op&gt;.times=K         ... and the K-1 matching calls after it (default 1)
 * &lt;op&gt;.probability=P   or: fail each matching call with probability P
 * &lt;op&gt;.path=S          only calls with a path containing S (either path, for rename)
 * &lt;op&gt;.regex=R         only calls with a path in which the Java regex R is found
 * &lt;op&gt;#&lt;n&gt;.KEY       (n = 1..9) another rule on the same operation, with its own counter
 * &lt;op&gt;.action=kill      instead of an IOException, SIGKILL this JVM at that call (after
 *                       logging it with kind "kill:&lt;at&gt;"): a crash aimed at a precise moment
 * &lt;op&gt;.scope=global    count calls across all JVMs (file-locked counter) instead of per JVM
 * create.at=close       fail when the object would be published, not when the stream is opened
 * rename.at=afterCopy   fail after the copy, before the delete: both source and destination stay
 * rename.at=end         fail (or kill) after the whole rename: the destination is published
 * shortReads=P          read(byte[],off,len) returns 1..len bytes at random with probability P
 *                       ("true" = 1.0), never 0, never EOF early; shortReads.path=S filters
 * diskFull.afterBytes=N after N bytes written in this JVM since arming (to paths matching
 *                       diskFull.path), every write fails: IOException("No space left on device")
 * seed=42               seed of the random generator (per JVM)
 * rename.delayMs, rename.existing, dirMarkers   settings, as above
 * delete.delayMs=N      a delete of an object whose path contains delete.delayPath (default: any)
 *                       returns N ms after the object is gone, so a test can race that window
 * create.delayMs=N      a create of a path containing create.delayPath (default: any) waits N ms
 *                       first (a slow create)
 * hsync=true            streams created from now on offer hsync/hflush (StreamCapabilities), as
 *                       HDFS's do; they flush to the temp file and publish nothing. Rules on the op
 *                       {@code hsync} fail those calls (at "start")
 * </pre>
 * Any key may also be given as Hadoop conf {@code fs.objtest.<key>}; the control file wins.
 * Every injected fault appends one line to {@code <root>/.objtest/faults.log}:
 * {@code epochMillis pid op kind call# path} (tab separated; a stream that short-reads logs once).
 */
public class ObjectStoreFileSystem extends FileSystem {
    public static final String SCHEME = "objtest";
    public static final String CONF_PREFIX = "fs.objtest.";
    public static final String ROOT_KEY = CONF_PREFIX + "root";
    /** Hidden from every bucket: temp files, control file, fault log, global counters. */
    public static final String META_DIR = ".objtest";
    static final String DIR_MARKER = ".objtest-dir-marker";
    static final long BLOCK_SIZE = 32L << 20;

    private static final ConcurrentHashMap<String, Control> CONTROLS = new ConcurrentHashMap<>();

    private URI uri;
    private String bucket;
    private Path workingDir;
    private java.nio.file.Path bucketDir;
    private java.nio.file.Path tmpDir;
    private Control control;

    @Override
    public String getScheme() {
        return SCHEME;
    }

    @Override
    public void initialize(URI name, Configuration conf) throws IOException {
        super.initialize(name, conf);
        setConf(conf);
        bucket = name.getAuthority();
        if (bucket == null || bucket.isEmpty() || bucket.equals(META_DIR)) {
            throw new IOException("objtest URIs name a bucket: objtest://bucket/key, got " + name);
        }
        String root = conf.get(ROOT_KEY);
        if (root == null || root.isEmpty()) root = System.getProperty("objtest.root");
        if (root == null || root.isEmpty()) root = System.getenv("OBJTEST_ROOT");
        if (root == null || root.isEmpty()) {
            throw new IOException("objtest needs a backing directory: set " + ROOT_KEY
                    + " (spark.hadoop." + ROOT_KEY + "), -Dobjtest.root or OBJTEST_ROOT");
        }
        java.nio.file.Path rootDir = java.nio.file.Paths.get(root).toAbsolutePath().normalize();
        uri = URI.create(SCHEME + "://" + bucket);
        workingDir = new Path(uri.toString() + "/");
        bucketDir = rootDir.resolve(bucket);
        tmpDir = rootDir.resolve(META_DIR).resolve("tmp");
        Files.createDirectories(bucketDir);
        Files.createDirectories(tmpDir);
        control = CONTROLS.computeIfAbsent(rootDir.toString(), r -> new Control(rootDir.resolve(META_DIR)));
    }

    @Override
    public URI getUri() {
        return uri;
    }

    @Override
    public Path getWorkingDirectory() {
        return workingDir;
    }

    @Override
    public void setWorkingDirectory(Path dir) {
        workingDir = makeQualified(dir);
    }

    // ---------------------------------------------------------------- paths and statuses

    private String key(Path path) {
        String p = makeQualified(path).toUri().getPath();
        while (p.startsWith("/")) p = p.substring(1);
        return p;
    }

    private java.nio.file.Path local(Path path) throws IOException {
        java.nio.file.Path local = bucketDir.resolve(key(path)).normalize();
        if (!local.startsWith(bucketDir)) throw new IOException("objtest: path escapes its bucket: " + path);
        return local;
    }

    private Path qualified(java.nio.file.Path local) {
        String rel = bucketDir.relativize(local).toString().replace('\\', '/');
        return new Path(SCHEME, bucket, "/" + rel);
    }

    private static boolean isObject(java.nio.file.Path local) {
        return Files.isRegularFile(local) && !local.getFileName().toString().equals(DIR_MARKER);
    }

    /** Every object (and marker) under a prefix; tolerates concurrent deletes. */
    private static void objectsUnder(java.nio.file.Path dir, List<java.nio.file.Path> out, boolean firstOnly)
            throws IOException {
        try (DirectoryStream<java.nio.file.Path> entries = Files.newDirectoryStream(dir)) {
            for (java.nio.file.Path entry : entries) {
                if (firstOnly && !out.isEmpty()) return;
                if (Files.isRegularFile(entry)) out.add(entry);
                else if (Files.isDirectory(entry)) objectsUnder(entry, out, firstOnly);
            }
        } catch (NoSuchFileException | java.nio.file.NotDirectoryException gone) {
            // deleted or replaced while we looked: nothing there
        }
    }

    private static boolean isPrefix(java.nio.file.Path local) throws IOException {
        if (!Files.isDirectory(local)) return false;
        List<java.nio.file.Path> found = new ArrayList<>(1);
        objectsUnder(local, found, true);
        return !found.isEmpty();
    }

    private FileStatus objectStatus(java.nio.file.Path local) throws IOException {
        BasicFileAttributes a = Files.readAttributes(local, BasicFileAttributes.class);
        return new FileStatus(a.size(), false, 1, BLOCK_SIZE, a.lastModifiedTime().toMillis(), qualified(local));
    }

    private FileStatus dirStatus(java.nio.file.Path local) {
        return new FileStatus(0, true, 1, BLOCK_SIZE, 0, qualified(local));
    }

    @Override
    public FileStatus getFileStatus(Path path) throws IOException {
        java.nio.file.Path local = local(path);
        if (local.equals(bucketDir)) return dirStatus(local);
        try {
            if (isObject(local)) return objectStatus(local);
        } catch (NoSuchFileException raced) {
            // deleted between the two checks: fall through
        }
        if (isPrefix(local)) return dirStatus(local);
        throw new FileNotFoundException("objtest: no object or prefix " + path);
    }

    @Override
    public FileStatus[] listStatus(Path path) throws IOException {
        control.maybeFail(this, "listStatus", "start", path);
        java.nio.file.Path local = local(path);
        if (isObject(local)) return new FileStatus[] {objectStatus(local)};
        if (!local.equals(bucketDir) && !isPrefix(local)) {
            throw new FileNotFoundException("objtest: no object or prefix " + path);
        }
        List<FileStatus> result = new ArrayList<>();
        List<java.nio.file.Path> children = new ArrayList<>();
        try (DirectoryStream<java.nio.file.Path> entries = Files.newDirectoryStream(local)) {
            entries.forEach(children::add);
        } catch (NoSuchFileException gone) {
            // an empty bucket
        }
        children.sort(null); // S3 lists in key order
        for (java.nio.file.Path child : children) {
            try {
                if (isObject(child)) result.add(objectStatus(child));
                else if (isPrefix(child)) result.add(dirStatus(child));
            } catch (NoSuchFileException raced) {
                // deleted while listing
            }
        }
        return result.toArray(new FileStatus[0]);
    }

    @Override
    public boolean mkdirs(Path path, FsPermission permission) throws IOException {
        java.nio.file.Path local = local(path);
        for (java.nio.file.Path p = local; p != null && p.startsWith(bucketDir) && !p.equals(bucketDir); p = p.getParent()) {
            if (isObject(p)) {
                if (p.equals(local)) throw new FileAlreadyExistsException("objtest: an object exists at " + path);
                throw new ParentNotDirectoryException("objtest: " + qualified(p) + " is an object, not a prefix");
            }
        }
        if (control.view(this, true).get("dirMarkers", "false").equals("true")) publish(emptyTemp(), local.resolve(DIR_MARKER));
        return true;
    }

    // ---------------------------------------------------------------- writes

    private java.nio.file.Path emptyTemp() throws IOException {
        return Files.createFile(tmpDir.resolve(UUID.randomUUID() + ".part"));
    }

    /** The PUT: a temp file becomes the object at once, replacing any object there. */
    private void publish(java.nio.file.Path temp, java.nio.file.Path target) throws IOException {
        for (java.nio.file.Path p = target.getParent(); p != null && p.startsWith(bucketDir); p = p.getParent()) {
            if (isObject(p)) {
                Files.deleteIfExists(temp);
                throw new ParentNotDirectoryException("objtest cannot store an object under another object's key: "
                        + qualified(p));
            }
        }
        Files.createDirectories(target.getParent());
        if (Files.isDirectory(target)) {
            Files.deleteIfExists(temp);
            throw new FileAlreadyExistsException("objtest: " + qualified(target) + " is a prefix");
        }
        try {
            Files.move(temp, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        } catch (AtomicMoveNotSupportedException e) {
            throw new IOException("objtest needs its root on one local filesystem", e);
        }
    }

    @Override
    public FSDataOutputStream create(Path path, FsPermission permission, boolean overwrite, int bufferSize,
                                     short replication, long blockSize, Progressable progress) throws IOException {
        control.maybeFail(this, "create", "start", path);
        Control.View settings = control.view(this, false);
        long delayMs = Long.parseLong(settings.get("create.delayMs", "0"));
        if (delayMs > 0 && path.toString().contains(settings.get("create.delayPath", ""))) {
            try {
                Thread.sleep(delayMs); // a slow create (s3a's probes, a busy NameNode)
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new java.io.InterruptedIOException("objtest: create of " + path + " interrupted");
            }
        }
        java.nio.file.Path target = local(path);
        if (target.equals(bucketDir) || isPrefix(target)) {
            throw new FileAlreadyExistsException("objtest: " + path + " is a prefix (a directory)");
        }
        if (!overwrite && isObject(target)) throw new FileAlreadyExistsException("objtest: " + path + " exists");
        // hsync=true: streams offer hsync as HDFS's do (it publishes nothing still), so that the
        // code paths that write ahead and hsync run here, and can meet hsync faults.
        java.nio.file.Path temp = emptyTemp();
        OutputStream object = settings.get("hsync", "false").equals("true")
                ? new SyncablePendingObject(path, target, temp) : new PendingObject(path, target, temp);
        return new FSDataOutputStream(object, statistics);
    }

    @Override
    public FSDataOutputStream createNonRecursive(Path path, FsPermission permission, boolean overwrite,
                                                 int bufferSize, short replication, long blockSize,
                                                 Progressable progress) throws IOException {
        // No directories to require: same as create (s3a does the same).
        return create(path, permission, overwrite, bufferSize, replication, blockSize, progress);
    }

    @Override
    public FSDataOutputStream append(Path path, int bufferSize, Progressable progress) throws IOException {
        throw new UnsupportedOperationException("objtest: objects cannot be appended to (as on S3)");
    }

    /** A PendingObject whose hsync and hflush flush to its temp file (rule op "hsync" fails them). */
    private final class SyncablePendingObject extends PendingObject implements Syncable, StreamCapabilities {
        SyncablePendingObject(Path path, java.nio.file.Path target, java.nio.file.Path temp) throws IOException {
            super(path, target, temp);
        }

        @Override
        public boolean hasCapability(String capability) {
            return capability.equalsIgnoreCase(StreamCapabilities.HSYNC)
                    || capability.equalsIgnoreCase(StreamCapabilities.HFLUSH);
        }

        @Override
        public void hflush() throws IOException {
            hsync();
        }

        @Override
        public void hsync() throws IOException {
            checkOpen();
            control.maybeFail(ObjectStoreFileSystem.this, "hsync", "start", path);
            flush();
        }
    }

    /** An object being written: bytes go to a temp file that close() publishes. */
    private class PendingObject extends OutputStream {
        final Path path;
        private final java.nio.file.Path target;
        private final java.nio.file.Path temp;
        private final OutputStream out;
        private boolean closed;
        private IOException failure;

        PendingObject(Path path, java.nio.file.Path target, java.nio.file.Path temp) throws IOException {
            this.path = path;
            this.target = target;
            this.temp = temp;
            this.out = new java.io.BufferedOutputStream(Files.newOutputStream(temp, StandardOpenOption.WRITE), 65536);
        }

        void checkOpen() throws IOException {
            if (closed) throw new IOException("objtest: stream closed: " + path);
            if (failure != null) throw new IOException("objtest: stream failed earlier: " + path, failure);
        }

        @Override
        public void write(int b) throws IOException {
            write(new byte[] {(byte) b}, 0, 1);
        }

        @Override
        public void write(byte[] b, int off, int len) throws IOException {
            checkOpen();
            Objects.checkFromIndexSize(off, len, b.length);
            long allowed = control.chargeWrite(ObjectStoreFileSystem.this, path, len);
            if (allowed < len) {
                out.write(b, off, (int) allowed); // like a disk, write what fits, then fail
                failure = new IOException("No space left on device");
                throw failure;
            }
            out.write(b, off, len);
        }

        @Override
        public void flush() throws IOException {
            checkOpen();
            out.flush(); // to the temp file only: nothing is visible before close()
        }

        @Override
        public void close() throws IOException {
            if (closed) return;
            closed = true;
            try {
                out.close();
                if (failure != null) throw new IOException("objtest: not published, a write failed: " + path, failure);
                control.maybeFail(ObjectStoreFileSystem.this, "create", "close", path);
                publish(temp, target);
            } finally {
                Files.deleteIfExists(temp);
            }
        }
    }

    // ---------------------------------------------------------------- reads

    @Override
    public FSDataInputStream open(Path path, int bufferSize) throws IOException {
        control.maybeFail(this, "open", "start", path);
        java.nio.file.Path local = local(path);
        if (!isObject(local)) {
            throw new FileNotFoundException("objtest: no object " + path + (isPrefix(local) ? " (a prefix)" : ""));
        }
        RandomAccessFile file;
        try {
            file = new RandomAccessFile(local.toFile(), "r");
        } catch (FileNotFoundException raced) {
            throw new FileNotFoundException("objtest: no object " + path);
        }
        return new FSDataInputStream(new ObjectInputStream(path, file));
    }

    private final class ObjectInputStream extends FSInputStream {
        private final Path path;
        private final RandomAccessFile file;
        private boolean loggedShortRead;

        ObjectInputStream(Path path, RandomAccessFile file) {
            this.path = path;
            this.file = file;
        }

        @Override
        public int read() throws IOException {
            return file.read();
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            Objects.checkFromIndexSize(off, len, b.length);
            if (len > 1) {
                int shorter = control.shortRead(ObjectStoreFileSystem.this, path, len);
                if (shorter < len) {
                    int n = file.read(b, off, shorter);
                    if (n > 0 && !loggedShortRead) {
                        loggedShortRead = true;
                        control.log("open", "shortRead", 0, path);
                    }
                    return n;
                }
            }
            return file.read(b, off, len);
        }

        @Override
        public void seek(long pos) throws IOException {
            if (pos < 0) throw new java.io.EOFException("objtest: negative seek " + pos);
            file.seek(pos);
        }

        @Override
        public long getPos() throws IOException {
            return file.getFilePointer();
        }

        @Override
        public boolean seekToNewSource(long targetPos) {
            return false;
        }

        @Override
        public int available() throws IOException {
            return (int) Math.min(Integer.MAX_VALUE, Math.max(0, file.length() - file.getFilePointer()));
        }

        @Override
        public void close() throws IOException {
            file.close();
        }
    }

    // ---------------------------------------------------------------- rename and delete

    @Override
    public boolean rename(Path src, Path dst) throws IOException {
        control.maybeFail(this, "rename", "start", src, dst);
        Control.View settings = control.view(this, false);
        java.nio.file.Path from = local(src);
        java.nio.file.Path to = local(dst);
        if (from.equals(bucketDir)) return false;
        boolean srcIsObject = isObject(from);
        if (!srcIsObject && !isPrefix(from)) return false; // s3a: missing source -> false
        if (from.equals(to)) return srcIsObject;
        if (!srcIsObject && to.startsWith(from)) return false; // into its own subtree

        boolean dstIsObject = isObject(to);
        boolean dstIsPrefix = !dstIsObject && (to.equals(bucketDir) || isPrefix(to));
        java.nio.file.Path target = to;
        if (srcIsObject) {
            if (dstIsPrefix) target = to.resolve(from.getFileName().toString());
            if (isObject(target)) {
                String existing = settings.get("rename.existing", "fail");
                if (existing.equals("false")) return false;
                if (!existing.equals("overwrite")) {
                    throw new FileAlreadyExistsException("Failed to rename " + src + " to " + dst
                            + "; destination file exists");
                }
            }
        } else {
            if (dstIsObject) {
                throw new FileAlreadyExistsException("Failed to rename " + src + " to " + dst
                        + "; source is a directory and dest is a file");
            }
            if (dstIsPrefix && hasRealObjects(to)) return false; // destination is a non-empty directory
        }
        for (java.nio.file.Path p = target.getParent(); p != null && p.startsWith(bucketDir); p = p.getParent()) {
            if (isObject(p)) return false; // destination parent is not a directory
        }

        List<java.nio.file.Path> sources = new ArrayList<>();
        if (srcIsObject) sources.add(from);
        else objectsUnder(from, sources, false);
        for (java.nio.file.Path s : sources) { // phase 1: copy every object (S3 CopyObject)
            java.nio.file.Path temp = tmpDir.resolve(UUID.randomUUID() + ".part");
            try {
                Files.copy(s, temp);
            } catch (NoSuchFileException raced) {
                continue;
            }
            publish(temp, srcIsObject ? target : target.resolve(from.relativize(s).toString()));
        }
        long delayMs = Long.parseLong(settings.get("rename.delayMs", "0"));
        if (delayMs > 0) {
            try {
                Thread.sleep(delayMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new java.io.InterruptedIOException("objtest: rename interrupted between copy and delete");
            }
        }
        control.maybeFail(this, "rename", "afterCopy", src, dst);
        for (java.nio.file.Path s : sources) Files.deleteIfExists(s); // phase 2: delete the sources
        control.maybeFail(this, "rename", "end", src, dst);
        return true;
    }

    private static boolean hasRealObjects(java.nio.file.Path dir) throws IOException {
        List<java.nio.file.Path> all = new ArrayList<>();
        objectsUnder(dir, all, false);
        return all.stream().anyMatch(p -> !p.getFileName().toString().equals(DIR_MARKER));
    }

    @Override
    public boolean delete(Path path, boolean recursive) throws IOException {
        control.maybeFail(this, "delete", "start", path);
        java.nio.file.Path local = local(path);
        if (isObject(local)) {
            boolean deleted = Files.deleteIfExists(local);
            Control.View settings = control.view(this, false);
            long delayMs = Long.parseLong(settings.get("delete.delayMs", "0"));
            if (delayMs > 0 && path.toString().contains(settings.get("delete.delayPath", ""))) {
                try {
                    Thread.sleep(delayMs); // the object is absent meanwhile: a test races that window
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new java.io.InterruptedIOException("objtest: delete interrupted after it deleted " + path);
                }
            }
            return deleted;
        }
        if (!isPrefix(local)) return false;
        if (!recursive && hasRealObjects(local)) {
            throw new PathIsNotEmptyDirectoryException("objtest: " + path + " is not empty");
        }
        if (local.equals(bucketDir)) return false; // s3a refuses to delete a bucket's root
        List<java.nio.file.Path> objects = new ArrayList<>();
        objectsUnder(local, objects, false);
        for (java.nio.file.Path o : objects) Files.deleteIfExists(o);
        return true;
    }

    // ---------------------------------------------------------------- settings and faults

    /**
     * The fault rules of one backing root in this JVM, shared by every FileSystem instance on it
     * (Hadoop caches one instance per bucket and user).
     */
    static final class Control {
        private final java.nio.file.Path metaDir;
        private final java.nio.file.Path controlFile;
        private final java.nio.file.Path logFile;
        private final Object globalLock = new Object();
        private volatile Properties rules = new Properties();
        private volatile String generation = "none";
        private Object seenVersion;
        private final ConcurrentHashMap<String, AtomicLong> calls = new ConcurrentHashMap<>();
        private final AtomicLong bytesWritten = new AtomicLong();
        private Random random = new Random(42);

        Control(java.nio.file.Path metaDir) {
            this.metaDir = metaDir;
            this.controlFile = metaDir.resolve("control");
            this.logFile = metaDir.resolve("faults.log");
        }

        /** Re-reads the control file if it changed since the last call (one stat). */
        synchronized Properties current() {
            Object version;
            try {
                BasicFileAttributes a = Files.readAttributes(controlFile, BasicFileAttributes.class);
                version = List.of(String.valueOf(a.fileKey()), a.lastModifiedTime().toString(), a.size());
            } catch (IOException missing) {
                version = "missing";
            }
            if (!version.equals(seenVersion)) {
                Properties fresh = new Properties();
                if (!version.equals("missing")) {
                    try (var in = Files.newBufferedReader(controlFile, StandardCharsets.UTF_8)) {
                        fresh.load(in);
                    } catch (IOException raced) {
                        return rules; // replaced while we read: next call sees the new one
                    }
                }
                seenVersion = version;
                rules = fresh;
                generation = fresh.getProperty("generation", String.valueOf(version.hashCode()));
                calls.clear();
                bytesWritten.set(0);
                random = new Random(Long.parseLong(fresh.getProperty("seed", "42").trim()));
            }
            return rules;
        }

        /** The rules as of now: {@code refresh} re-reads a changed control file (one stat). */
        View view(ObjectStoreFileSystem fs, boolean refresh) {
            return new View(refresh ? current() : rules, fs.getConf());
        }

        static final class View {
            private final Properties rules;
            private final Configuration conf;

            View(Properties rules, Configuration conf) {
                this.rules = rules;
                this.conf = conf;
            }

            String get(String key, String fallback) {
                String v = rules.getProperty(key);
                if (v == null && conf != null) v = conf.get(CONF_PREFIX + key);
                return v == null ? fallback : v.trim();
            }
        }

        private static boolean matches(String filter, Path... paths) {
            if (filter == null || filter.isEmpty()) return true;
            for (Path p : paths) if (p.toString().contains(filter)) return true;
            return false;
        }

        static final int RULE_SLOTS = 9;

        private static boolean matchesRegex(String regex, Path... paths) {
            if (regex == null || regex.isEmpty()) return true;
            java.util.regex.Pattern pattern = java.util.regex.Pattern.compile(regex);
            for (Path p : paths) if (pattern.matcher(p.toString()).find()) return true;
            return false;
        }

        /** SIGKILL of this JVM, as a crash at this very point: no shutdown hook, no further
         *  filesystem call of this thread (it waits for the signal). */
        private static void killThisJvm() {
            try {
                new ProcessBuilder("kill", "-KILL", String.valueOf(ProcessHandle.current().pid()))
                        .inheritIO().start();
                while (true) Thread.sleep(60_000);
            } catch (IOException | InterruptedException e) {
                Runtime.getRuntime().halt(137); // no kill(1): still no shutdown hook runs
            }
        }

        private synchronized double nextDouble() {
            return random.nextDouble();
        }

        private synchronized int nextInt(int bound) {
            return random.nextInt(bound);
        }

        /** Every FileSystem call passes here first (at "start"): the control file is re-read then. */
        void maybeFail(ObjectStoreFileSystem fs, String op, String at, Path... paths) throws IOException {
            View r = view(fs, at.equals("start"));
            maybeFail(r, op, op, at, paths);
            for (int slot = 1; slot <= RULE_SLOTS; slot++) maybeFail(r, op, op + "#" + slot, at, paths);
        }

        /** One rule: {@code rule} is the operation's name, or {@code <op>#<slot>} for another rule on it. */
        private void maybeFail(View r, String opName, String op, String at, Path... paths) throws IOException {
            String nth = r.get(op + ".nth", null);
            String probability = r.get(op + ".probability", null);
            if (nth == null && probability == null) return;
            if (!r.get(op + ".at", "start").equals(at)) return;
            if (!matches(r.get(op + ".path", null), paths)) return;
            if (!matchesRegex(r.get(op + ".regex", null), paths)) return;
            long n = r.get(op + ".scope", "jvm").equals("global")
                    ? globalIncrement(op)
                    : calls.computeIfAbsent(op, k -> new AtomicLong()).incrementAndGet();
            boolean fail;
            if (nth != null) {
                long first = Long.parseLong(nth);
                fail = n >= first && n < first + Long.parseLong(r.get(op + ".times", "1"));
            } else {
                fail = nextDouble() < Double.parseDouble(probability);
            }
            if (fail && r.get(op + ".action", "fail").equals("kill")) {
                log(opName, "kill:" + at, n, paths);
                killThisJvm();
            }
            if (fail) {
                log(opName, at, n, paths);
                throw new IOException("objtest: injected " + opName + " fault (" + at + ", matching call #" + n
                        + ") on " + java.util.Arrays.toString(paths));
            }
        }

        /** How many of len bytes may still be written before the emulated disk is full. */
        long chargeWrite(ObjectStoreFileSystem fs, Path path, int len) {
            View r = view(fs, false);
            String after = r.get("diskFull.afterBytes", null);
            if (after == null || !matches(r.get("diskFull.path", null), path)) return len;
            long limit = Long.parseLong(after);
            long before = bytesWritten.getAndAdd(len);
            long allowed = Math.max(0, Math.min(len, limit - before));
            if (allowed < len) log("write", "diskFull", before + len, path);
            return allowed;
        }

        /** A shorter length to read, or len. */
        int shortRead(ObjectStoreFileSystem fs, Path path, int len) {
            View r = view(fs, false);
            String p = r.get("shortReads", null);
            if (p == null || p.equals("false") || !matches(r.get("shortReads.path", null), path)) return len;
            double probability = p.equals("true") ? 1.0 : Double.parseDouble(p);
            if (nextDouble() >= probability) return len;
            return 1 + nextInt(len - 1); // 1 .. len-1
        }

        private long globalIncrement(String op) throws IOException {
            java.nio.file.Path counter = metaDir.resolve("counters").resolve(generation + "." + op);
            synchronized (globalLock) { // FileLock is per process: threads of one JVM queue here
                Files.createDirectories(counter.getParent());
                try (FileChannel ch = FileChannel.open(counter, StandardOpenOption.CREATE,
                        StandardOpenOption.READ, StandardOpenOption.WRITE);
                     FileLock ignored = ch.lock()) {
                    ByteBuffer buf = ByteBuffer.allocate(8);
                    long n = ch.read(buf, 0) == 8 ? buf.flip().getLong() : 0;
                    buf.clear().putLong(n + 1).flip();
                    ch.write(buf, 0);
                    return n + 1;
                }
            }
        }

        void log(String op, String kind, long n, Path... paths) {
            StringBuilder line = new StringBuilder()
                    .append(System.currentTimeMillis()).append('\t').append(ProcessHandle.current().pid())
                    .append('\t').append(op).append('\t').append(kind).append('\t').append(n);
            for (Path p : paths) line.append('\t').append(p);
            line.append('\n');
            try { // one small O_APPEND write per line: lines from several JVMs do not interleave
                Files.createDirectories(metaDir);
                Files.write(logFile, line.toString().getBytes(StandardCharsets.UTF_8),
                        StandardOpenOption.CREATE, StandardOpenOption.APPEND);
            } catch (IOException e) {
                System.err.println("objtest: cannot log an injected fault: " + e);
            }
        }
    }
}
