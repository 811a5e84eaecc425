# --- watches: a directory's changes, from inotify ------------------------------------------------
#
# A watch is followed by the host as a process is (see processes.py): it answers `proc_started`,
# its events come as its stdout, one JSON line each ({"name": path relative to the watched
# directory, "type": "create" | "write" | "remove" | "rename" | "chmod"}, as E2B's envd reports
# fsnotify's), and `proc_signal` ends it (`proc_exit`). The process pump reads its inotify
# descriptor; a file operation of the host drains every watch before it answers, so that what it
# changed is reported before the caller hears that it is done.
#
#   {"op": "watch_start", "id": N, "path": "...", "roots": [...], "recursive": B}
#
# Files the host writes appear whole, by a rename from a temporary name: a watch reports them as
# envd reports its uploads (create or write, chmod, write), not the temporary file.

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
WATCH_MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
              | IN_DELETE_SELF | IN_MOVE_SELF)
# The most directories one recursive watch follows.
MAX_WATCHED_DIRS = 4096
_libc = None


def _is_upload_temp(name):
    """Whether `name` is one of the host's temporary names while it writes a file (`op_write`)."""
    head, _, tail = name.rpartition(".evervm-")
    return (head.startswith(".") and len(tail) == 12
            and all(c in "0123456789abcdef" for c in tail))


def _inotify():
    import ctypes

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _errno():
    import ctypes

    return ctypes.get_errno()


class _Watch:
    def __init__(self, ident, root, recursive):
        self.ident = ident
        self.root = root.rstrip("/") or "/"
        self.recursive = recursive
        libc = _inotify()
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(_errno(), "inotify_init1")
        # wd -> directory relative to the root ("" for the root).
        self.dirs = {}
        # Cookies of renames away from the host's temporary names: their other half is the
        # file the host wrote, reported as an upload (see `Processes.upload_done`).
        self.upload_cookies = set()
        self.add("")

    def add(self, relative):
        if len(self.dirs) >= MAX_WATCHED_DIRS:
            return
        path = self.root if not relative else self.root + "/" + relative
        wd = _inotify().inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
        if wd < 0:
            error = _errno()
            if not relative:
                raise OSError(error, os.strerror(error), path)
            return
        self.dirs[wd] = relative
        if self.recursive:
            try:
                entries = list(os.scandir(path))
            except OSError:
                return
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    self.add(entry.name if not relative else relative + "/" + entry.name)

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read_events(self):
        """The events waiting, as E2B names them: [(name, type)]."""
        events = []
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                break
            offset = 0
            while offset + 16 <= len(data):
                wd, mask, cookie, length = struct.unpack_from("iIII", data, offset)
                raw = data[offset + 16:offset + 16 + length].split(b"\0", 1)[0]
                offset += 16 + length
                events.extend(self._translate(wd, mask, cookie, os.fsdecode(raw)))
        return events

    def _translate(self, wd, mask, cookie, name):
        if mask & IN_IGNORED:
            self.dirs.pop(wd, None)
            return []
        if mask & IN_Q_OVERFLOW or wd not in self.dirs:
            return []
        relative = self.dirs[wd]
        if name and _is_upload_temp(name):
            if mask & IN_MOVED_FROM and len(self.upload_cookies) < 1024:
                self.upload_cookies.add(cookie)
            return []
        if mask & IN_MOVED_TO and cookie in self.upload_cookies:
            self.upload_cookies.discard(cookie)
            return []
        full = name if not relative else (relative + "/" + name if name else relative)
        if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO) and self.recursive:
            self.add(full)
        kinds = []
        if mask & (IN_CREATE | IN_MOVED_TO):
            kinds.append("create")
        if mask & (IN_MOVED_FROM | IN_MOVE_SELF):
            kinds.append("rename")
        if mask & IN_ATTRIB:
            kinds.append("chmod")
        if mask & IN_MODIFY:
            kinds.append("write")
        if mask & (IN_DELETE | IN_DELETE_SELF):
            kinds.append("remove")
        return [(full, kind) for kind in kinds]

    def relative(self, path):
        """`path` relative to the root if it is watched there (its directory is), else None."""
        directory, _, name = path.rpartition("/")
        directory = directory or "/"
        if directory == self.root:
            return name
        if self.recursive and directory.startswith(self.root.rstrip("/") + "/"):
            inside = directory[len(self.root.rstrip("/")) + 1:]
            if inside in self.dirs.values():
                return inside + "/" + name
        return None


def _watch_lines(events):
    return b"".join(
        json.dumps({"name": name, "type": kind}).encode("utf-8", "surrogatepass") + b"\n"
        for name, kind in events
    )
