"""Writing an output file (``--json``, ``--stats-json``, ``rack gen -o``) without replacing what
is not a file, reading a bounded input file, and naming a path in a line of output."""

from __future__ import annotations

import os
import stat


def write_file(dest: str, text: str) -> None:
    """Write ``text`` to ``dest``.

    A regular file, or a path that does not exist yet, is written to ``dest.tmp`` and renamed
    onto ``dest``, so that a reader never sees half of it. Anything else that exists (a FIFO,
    ``/dev/stdout``, ``/dev/null``, a terminal) is written in place: renaming onto it would
    replace the pipe or the device with a file (as root, ``--json /dev/full`` replaced the
    device). A failure removes the temporary file and raises the OSError.
    """
    try:
        special = not stat.S_ISREG(os.stat(dest).st_mode)
    except FileNotFoundError:
        special = False
    if special:
        with open(dest, "w") as f:
            f.write(text)
        return
    tmp = f"{dest}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, dest)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_text(path: str, max_bytes: int) -> str:
    """The UTF-8 text of the regular file ``path``, at most ``max_bytes`` long, without a
    leading byte-order mark.

    Raises
    ------
    ValueError
        One line: not a regular file (a FIFO waited forever for a writer, ``/dev/zero``
        filled the memory), too large, or not UTF-8.
    OSError
        The file cannot be opened or read (the caller names it).
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path!r} is not a regular file")
    if st.st_size > max_bytes:
        raise ValueError(f"{path!r} is {st.st_size} bytes, more than {max_bytes}")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)        # it may have grown since the stat
    if len(data) > max_bytes:
        raise ValueError(f"{path!r} is more than {max_bytes} bytes")
    try:
        # without a leading byte-order mark, which editors and Windows tools write: rack
        # files dropped it, and a workload file or a hostfile read it as part of a number
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise ValueError(f"{path!r} is not UTF-8 text") from None


def shown(path) -> str:
    """``path`` as a line of output names it: as given where every character prints, else
    quoted (``repr``), so that a newline or an escape sequence in a file name cannot end
    the line or forge another one (``wrote x\\nError: ...``)."""
    path = os.fspath(path)
    return path if isinstance(path, str) and path.isprintable() else repr(path)
