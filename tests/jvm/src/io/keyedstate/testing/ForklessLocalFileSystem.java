package io.keyedstate.testing;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.local.LocalConfigKeys;
import org.apache.hadoop.fs.permission.FsAction;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system ({@code file:}, through both {@code FileSystem} and
 * {@code FileContext}), except that permissions are set with {@code java.nio} instead of a
 * {@code chmod} child process, and symlinks are told apart without a {@code readlink} one.
 * Without Hadoop's native library (pyspark ships none), every file and checksum file Hadoop
 * creates forks {@code chmod}, and every path a FileContext resolves forks {@code readlink}
 * (about 230 processes per micro-batch of a stream-stream join on local files, most of the
 * batch's time on a 2-core machine). Same files, same bytes, same modes; the suite's shared session
 * uses it ({@code fs.file.impl} and {@code fs.AbstractFileSystem.file.impl}).
 */
public class ForklessLocalFileSystem extends LocalFileSystem {
    public ForklessLocalFileSystem() {
        super(new Raw());
    }

    /** RawLocalFileSystem whose setPermission does what chmod would, in-process. */
    public static class Raw extends RawLocalFileSystem {
        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            if (permission.getStickyBit()) {  // no java.nio equivalent: Hadoop's own way
                super.setPermission(p, permission);
                return;
            }
            Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission));
        }

        /** Hadoop forks {@code readlink} to tell a symlink apart (every FileContext call that
         *  resolves a path does, several per checkpoint file); java.nio tells it in-process. A
         *  path that is not a link has its own status, as in Hadoop's implementation. */
        @Override
        public FileStatus getFileLinkStatus(Path f) throws IOException {
            if (Files.isSymbolicLink(pathToFile(f).toPath())) {
                return super.getFileLinkStatus(f);
            }
            return getFileStatus(f);
        }
    }

    static Set<PosixFilePermission> posix(FsPermission permission) {
        Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
        add(set, permission.getUserAction(), PosixFilePermission.OWNER_READ,
            PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE);
        add(set, permission.getGroupAction(), PosixFilePermission.GROUP_READ,
            PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE);
        add(set, permission.getOtherAction(), PosixFilePermission.OTHERS_READ,
            PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);
        return set;
    }

    private static void add(Set<PosixFilePermission> set, FsAction action, PosixFilePermission r,
                            PosixFilePermission w, PosixFilePermission x) {
        if (action.implies(FsAction.READ)) set.add(r);
        if (action.implies(FsAction.WRITE)) set.add(w);
        if (action.implies(FsAction.EXECUTE)) set.add(x);
    }

    /** {@code fs.AbstractFileSystem.file.impl}: Hadoop's LocalFs over {@link Raw}. */
    public static class Fs extends ChecksumFs {
        public Fs(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(new RawFs(uri, conf));
        }
    }

    /** Hadoop's RawLocalFs over {@link Raw} (which, like it, ignores the URI it is given). */
    public static class RawFs extends DelegateToFileSystem {
        public RawFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(FsConstants.LOCAL_FS_URI, new Raw(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
        }

        @Override
        public int getUriDefaultPort() {
            return -1;
        }

        @Override
        @SuppressWarnings("deprecation")
        public FsServerDefaults getServerDefaults() throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        public FsServerDefaults getServerDefaults(Path f) throws IOException {
            return LocalConfigKeys.getServerDefaults();
        }

        @Override
        public boolean isValidName(String src) {
            return true;  // any local path is valid (as RawLocalFs says)
        }
    }
}
