"""
Files that are written whole or not at all, and the error of one that is not what it should be:
what every file format (llmc/formats/) and the ANE's state file (accel/ane/restart.py) share.

    atomic_write(path, chunks)     the bytes-like chunks to path, all or nothing
    FormatError(path, problem)     str(e) is "<path>: <problem>", on one line
"""
import os
import secrets


class FormatError(ValueError):
    """A file that is not what it should be. str(e) is "<path>: <problem>", on one line."""

    def __init__(self, path, problem=None):
        if problem is None:  # given a whole message
            message, self.path, self.problem = str(path), None, str(path)
        else:
            self.path, self.problem = os.fspath(path), str(problem)
            message = f"{self.path}: {self.problem}"
        super().__init__(" ".join(message.split("\n")))


def atomic_write(path, chunks):
    """Write the bytes-like `chunks` to path, all or nothing: they go to a temporary file in
    the same directory, which is synced and then renamed over path. On any error (a full
    disk, a failing chunk generator) the temporary file is removed, an existing file at path
    is left as it was, and the error is raised."""
    path = os.fspath(path)
    if isinstance(chunks, (bytes, bytearray, memoryview)):
        chunks = [chunks]
    directory = os.path.dirname(os.path.abspath(path))
    tmp_path = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}."
                                       f"{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp_path, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        try:
            os.unlink(tmp_path)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def _fsync_directory(directory):
    """Make the rename durable; best effort (some systems cannot open a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
