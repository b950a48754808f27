"""Where offline tools read and write a checkpoint: a local directory, or any Hadoop file system.

Production checkpoints live on s3a, abfss, gs or hdfs. Every offline tool reaches its checkpoint
through a :class:`Storage`, made by :func:`open_storage` (offline/storage.py adds the
SparkSession it needs) from the location exactly as the query
was given it:

* :class:`LocalStorage` for plain paths and ``file:`` URIs: pathlib, no JVM. The fast path, and
  the only one that needs neither Spark nor Java (``keyedstate get``/``verify`` on a local
  checkpoint start no JVM at all).
* :class:`HadoopStorage` for every other scheme: py4j into a SparkSession's JVM, through Spark's
  own ``CheckpointFileManager`` (the class ``spark.sql.streaming.checkpointFileManagerClass``
  names, else Spark's default for the scheme) and the Hadoop ``FileSystem``, with
  ``sessionState.newHadoopConf()``: the session's Hadoop conf plus its SQL confs, i.e. the
  credentials and file-system settings the query itself uses. Files appear atomically
  (``createAtomic``), as they do when Spark writes them.

RocksDB can only open local files, so tools that rebuild a version copy what they need to a
local temporary directory first (:meth:`Storage.fetch`: a hard link or copy for local storage, a
download for Hadoop storage) and upload what they produce (:meth:`Storage.upload`). Paths are
strings throughout (a URI for Hadoop storage); :meth:`Storage.join` builds them.

Errors are :class:`StorageError`, naming the path and what failed.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..formats import layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


class StorageError(OSError):
    """A checkpoint file could not be listed, read or written; the message names it."""


class MissingFileError(StorageError, FileNotFoundError):
    """The file to read does not exist (every storage raises this one, so that a caller can tell
    a file that is absent, e.g. purged from Spark's logs, from one it cannot read)."""


@dataclass(frozen=True)
class Entry:
    """One directory entry."""

    name: str
    is_dir: bool
    size: int
    mtime_ms: int


def is_local(location: str | os.PathLike) -> bool:
    """A plain path or a ``file:`` URI (Windows drive letters are not schemes)."""
    text = os.fspath(location)
    return text.startswith("file:") or not _SCHEME.match(text) or bool(re.match(r"^[a-zA-Z]:[\\/]", text))


def local_path(location: str | os.PathLike) -> Path:
    """The local directory of a plain path or ``file:`` URI."""
    text = os.fspath(location)
    if text.startswith("file:"):
        text = re.sub(r"^file:(//)?", "", text)
    return Path(text).absolute()


class Storage:
    """The operations offline tools need on a checkpoint (see the module doc)."""

    root: str
    local = False

    def join(self, base: str, *parts: str) -> str:
        out = base.rstrip("/")
        for p in parts:
            out = f"{out}/{p.strip('/')}"
        return out

    def name(self, path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[-1]

    def parent(self, path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[0]

    # -- to implement -------------------------------------------------------------------------
    def list(self, path: str) -> list[Entry]:
        """Entries of a directory, hidden ones (``.`` prefix) included; [] when it is missing."""
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        raise NotImplementedError

    def is_dir(self, path: str) -> bool:
        raise NotImplementedError

    def size(self, path: str) -> int | None:
        """A file's size, None when it is missing."""
        raise NotImplementedError

    def read_bytes(self, path: str, limit: int | None = None, kind: str = "file") -> bytes:
        """The file's bytes; :class:`MissingFileError` when it does not exist. ``limit``: a longer
        file (a ``kind``) is refused unread with :class:`StorageError` (``layout.check_size``)."""
        raise NotImplementedError

    def fetch(self, path: str, local: Path, link: bool = True) -> None:
        """Make the file available at the (new) local path ``local``; a hard link where possible
        when ``link`` (the file must then never be modified)."""
        raise NotImplementedError

    def write_atomic(self, path: str, data: bytes, overwrite: bool = False) -> bool:
        """Publish ``data`` whole under ``path``; False (nothing written) if it exists and not
        ``overwrite``."""
        raise NotImplementedError

    def upload(self, local: Path, path: str) -> None:
        """Copy a local file to ``path`` (atomically: it appears whole)."""
        raise NotImplementedError

    def replace(self, path: str, data: bytes) -> None:
        """Replace an existing file's content in one atomic step: readers see the old or the new
        content, never neither (how depends on the file system; see the implementations)."""
        raise NotImplementedError

    def delete(self, path: str) -> None:
        """Delete a file or a directory tree; a missing one is not an error."""
        raise NotImplementedError

    def mkdirs(self, path: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__

    def local_dir(self, path: str) -> Path | None:
        """The local directory behind ``path`` (LocalStorage only), else None."""
        return None


class LocalStorage(Storage):
    """A checkpoint on a local (or locally mounted) file system: plain paths and ``file:`` URIs.

    Every path must lie below the root through no symbolic link (:meth:`_checked`), and a
    listing refuses a link among its entries: the tools read, write and delete by path, and a
    link planted in a checkpoint (``ks-files -> ~``) would make them do so elsewhere."""

    local = True

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = str(local_path(root))

    def _checked(self, path: str, write: bool = False) -> str:
        return inside(self.root, path, write)

    def list(self, path: str) -> list[Entry]:
        self._checked(path)
        try:
            with os.scandir(path) as it:
                out = []
                for e in it:
                    if e.is_symlink():
                        raise StorageError(link_refused(e.path))
                    try:
                        st = e.stat()
                    except FileNotFoundError:
                        continue
                    out.append(Entry(e.name, e.is_dir(), st.st_size, int(st.st_mtime * 1000)))
                return out
        except (FileNotFoundError, NotADirectoryError):
            return []
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(f"cannot list {path}: {exc.strerror or exc}") from exc

    def exists(self, path: str) -> bool:
        return os.path.exists(self._checked(path))

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._checked(path))

    def size(self, path: str) -> int | None:
        self._checked(path)
        try:
            return os.stat(path).st_size
        except OSError:
            return None

    def read_bytes(self, path: str, limit: int | None = None, kind: str = "file") -> bytes:
        self._checked(path)
        try:
            return layout.read_file(path, limit, kind)
        except layout.TooLargeError as exc:
            raise StorageError(str(exc)) from None
        except FileNotFoundError:
            raise MissingFileError(f"cannot read {path}: it does not exist") from None
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def fetch(self, path: str, local: Path, link: bool = True) -> None:
        self._checked(path)
        try:
            if link:
                try:
                    os.link(path, local)
                    return
                except OSError:
                    pass
            shutil.copyfile(path, local)
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def write_atomic(self, path: str, data: bytes, overwrite: bool = False) -> bool:
        target = Path(self._checked(path, write=True))
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.{uuid.uuid4()}.tmp"
        try:
            with open(temp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if overwrite:
                os.replace(temp, target)
            else:
                try:
                    os.link(temp, target)  # fails if the target exists: no overwrite, atomically
                except FileExistsError:
                    return False
            return True
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
        finally:
            temp.unlink(missing_ok=True)

    def upload(self, local: Path, path: str) -> None:
        target = Path(self._checked(path, write=True))
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}.{uuid.uuid4()}.tmp"
        try:
            try:
                os.link(local, temp)
            except OSError:
                shutil.copyfile(local, temp)
            os.replace(temp, target)
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
        finally:
            temp.unlink(missing_ok=True)

    def replace(self, path: str, data: bytes) -> None:
        """A rename over the old file (POSIX: atomic). Hadoop's local file system keeps a
        ``.<name>.crc`` checksum beside files Spark wrote and verifies it on read: it is removed
        first (a missing checksum is not checked; a stale one would fail the read)."""
        target = Path(self._checked(path, write=True))
        (target.parent / f".{target.name}.crc").unlink(missing_ok=True)
        self.write_atomic(path, data, overwrite=True)

    def delete(self, path: str) -> None:
        self._checked(path, write=True)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot delete {path}: {exc.strerror or exc}") from exc

    def mkdirs(self, path: str) -> None:
        os.makedirs(self._checked(path, write=True), exist_ok=True)

    def local_dir(self, path: str) -> Path | None:
        return Path(path)

    def describe(self) -> str:
        return "local files"


def inside(root: str, path: str, write: bool = False) -> str:
    """``path``, refused unless it is below the root and no part of it below the root (as far
    as it exists) is a symbolic link; for a write or delete, also unless it resolves there."""
    base = root.rstrip(os.sep) + os.sep
    if path != root and not path.startswith(base):
        raise StorageError(f"{path} is outside the checkpoint {root}")
    current = root
    for part in path[len(base):].split(os.sep) if path != root else ():
        if part in ("", ".", ".."):
            raise StorageError(f"{path} is not a plain path inside the checkpoint {root}")
        current = os.path.join(current, part)
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                raise StorageError(link_refused(current))
        except (FileNotFoundError, NotADirectoryError):
            break
    if write and not os.path.realpath(path).startswith(os.path.realpath(root).rstrip(os.sep) + os.sep):
        raise StorageError(f"{path} resolves to {os.path.realpath(path)}, outside the checkpoint {root}")
    return path


def link_refused(path: str | os.PathLike) -> str:
    """Why a symbolic link inside a checkpoint is refused (LocalStorage, listing.refuse_links)."""
    return (f"{path} is a symbolic link: keyedstate's offline tools follow no link inside a checkpoint "
            "(it could make them read, write or delete files elsewhere); replace it by what it points to")


class HadoopStorage(Storage):
    """A checkpoint on any Hadoop file system, through the JVM of a SparkSession (py4j).

    Reads and listings go through Spark's ``CheckpointFileManager``; sizes through the Hadoop
    ``FileSystem`` (the manager has no stat); writes through ``createAtomic``, so that what the
    tools publish appears whole, as Spark's own files do. Large files move JVM-side
    (``copyToLocalFile``, ``Files.copy`` into the atomic stream): their bytes never cross py4j.
    """

    def __init__(self, root: str, spark: "SparkSession") -> None:
        self.spark = spark
        self._jvm = spark.sparkContext._jvm
        self.conf = spark._jsparkSession.sessionState().newHadoopConf()
        self._hpath = self._jvm.org.apache.hadoop.fs.Path
        root_path = self._hpath(root.rstrip("/") or root)
        self.fs = root_path.getFileSystem(self.conf)
        self.root = str(self.fs.makeQualified(root_path).toString())
        cfm = self._jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
        self.fm = cfm.create(root_path, self.conf)

    def describe(self) -> str:
        return f"{self.fm.getClass().getSimpleName()} on {self.fs.getClass().getName()}"

    def _p(self, path: str):
        """The Hadoop path of ``path``, refused unless it is the root or a plain path below it:
        Hadoop's ``Path`` resolves ``..`` itself, and ``mkdirs`` makes every missing ancestor, so
        a name taken from a tampered checkpoint would otherwise reach (and create) directories
        elsewhere on the file system."""
        if any(part in (".", "..") for part in path.split("/")):
            raise StorageError(f"{path} is not a plain path inside the checkpoint {self.root}")
        p = self._hpath(path)
        qualified = str(self.fs.makeQualified(p).toString())
        if qualified != self.root and not qualified.startswith(self.root.rstrip("/") + "/"):
            raise StorageError(f"{path} is outside the checkpoint {self.root}")
        return p

    def _call(self, what: str, path: str, fn):
        from py4j.protocol import Py4JJavaError

        try:
            return fn()
        except Py4JJavaError as exc:
            message = exc.java_exception.toString()
            if "FileNotFoundException" in message:
                raise MissingFileError(f"cannot {what} {path}: it does not exist") from None
            raise StorageError(f"cannot {what} {path}: {message}") from None

    def list(self, path: str) -> list[Entry]:
        def run():
            p = self._p(path)
            if not self.fm.exists(p):
                return []
            out = []
            for st in self.fm.list(p):
                out.append(Entry(st.getPath().getName(), bool(st.isDirectory()), int(st.getLen()),
                                 int(st.getModificationTime())))
            return out
        try:
            return self._call("list", path, run)
        except FileNotFoundError:
            return []

    def exists(self, path: str) -> bool:
        return bool(self._call("check", path, lambda: self.fm.exists(self._p(path))))

    def is_dir(self, path: str) -> bool:
        try:
            return bool(self._call("stat", path, lambda: self.fs.getFileStatus(self._p(path)).isDirectory()))
        except FileNotFoundError:
            return False

    def size(self, path: str) -> int | None:
        try:
            st = self._call("stat", path, lambda: self.fs.getFileStatus(self._p(path)))
        except FileNotFoundError:
            return None
        return int(st.getLen()) if st.isFile() else None

    def read_bytes(self, path: str, limit: int | None = None, kind: str = "file") -> bytes:
        if limit is not None:
            size = self.size(path)
            try:
                layout.check_size(size or 0, limit, path, kind)
            except layout.TooLargeError as exc:
                raise StorageError(str(exc)) from None

        def run():
            stream = self.fm.open(self._p(path))
            try:
                return bytes(self._jvm.org.apache.hadoop.io.IOUtils.readFullyToByteArray(stream))
            finally:
                stream.close()
        return self._call("read", path, run)

    def fetch(self, path: str, local: Path, link: bool = True) -> None:
        local_uri = self._jvm.java.io.File(str(local)).toURI().toString()

        def run():
            # useRawLocalFileSystem: no .crc file beside the copy
            self.fs.copyToLocalFile(False, self._p(path), self._hpath(local_uri), True)
        self._call("download", path, run)

    def write_atomic(self, path: str, data: bytes, overwrite: bool = False) -> bool:
        def run():
            p = self._p(path)
            if not overwrite and self.fm.exists(p):
                return False
            out = self.fm.createAtomic(p, overwrite)
            try:
                out.write(bytearray(data))
                out.close()
            except Exception:
                out.cancel()
                raise
            return True
        return self._write(path, run)

    def upload(self, local: Path, path: str) -> None:
        def run():
            out = self.fm.createAtomic(self._p(path), True)
            try:
                self._jvm.java.nio.file.Files.copy(self._jvm.java.io.File(str(local)).toPath(), out)
                out.close()
            except Exception:
                out.cancel()
                raise
        self._write(path, run)

    def replace(self, path: str, data: bytes) -> None:
        """With a FileContext-based manager (HDFS, local): ``createAtomic(overwrite)``, a rename
        with OVERWRITE (atomic on HDFS). Otherwise (object stores: Spark's FileSystem-based
        manager, whose rename cannot replace a file): ``FileSystem.create(overwrite)``, which an
        object store publishes as one PUT on close, replacing the object whole."""
        def run():
            p = self._p(path)
            if "FileContext" in self.fm.getClass().getName():
                out = self.fm.createAtomic(p, True)
                try:
                    out.write(bytearray(data))
                    out.close()
                except Exception:
                    out.cancel()
                    raise
            else:
                out = self.fs.create(p, True)
                out.write(bytearray(data))
                out.close()
        self._write(path, run)

    def _write(self, path: str, run):
        """``run``, a write of ``path``; if ``path``'s directory is missing, it is made and the
        write tried again: an atomic create makes no parents on a store with directories (HDFS,
        through Spark's FileContext-based manager), and a tool writes into new ones (a rescale's
        new partitions, the state processor's undo records)."""
        try:
            return self._call("write", path, run)
        except MissingFileError:
            self.mkdirs(self.parent(path))
            return self._call("write", path, run)

    def delete(self, path: str) -> None:
        self._call("delete", path, lambda: self.fm.delete(self._p(path)))

    def mkdirs(self, path: str) -> None:
        self._call("create the directory", path, lambda: self.fm.mkdirs(self._p(path)))


def open_storage(location: str | os.PathLike, spark: "SparkSession | None" = None) -> Storage:
    """The storage of a checkpoint location as a query names it: local paths and ``file:`` URIs
    never need Spark; any other scheme goes through ``spark`` (required then; the offline tools
    pass their session, see offline/storage.py)."""
    text = os.fspath(location)
    if is_local(text):
        return LocalStorage(text)
    if spark is None:
        raise StorageError(f"{text}: a checkpoint on this file system is reached through a SparkSession; none given")
    return HadoopStorage(text, spark)


def describe_location(storage: Storage, path: str) -> dict[str, Any]:
    return {"path": path, "storage": storage.describe()}
