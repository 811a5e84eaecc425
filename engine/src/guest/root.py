# --- root inside the sandbox: what `sudo` asks ---------------------------------------------------
#
# In a gVisor sandbox the agent starts as root (with a container's usual capabilities, never
# CAP_SYS_ADMIN) and, before anything else, forks this helper and drops to the machine's user.
# gVisor ignores set-user-ID bits, so `sudo` (the image's /usr/bin/sudo, `sudo.py`) cannot become
# root by itself: it connects to the helper's socket, hands over its stdin, stdout and stderr and
# the command, and the helper runs the command as root (or as `-u USER`) and reports how it ended.
# Everyone in the sandbox is the machine's user and may use `sudo` without a password, as in
# E2B's sandboxes: the sandbox is the boundary, not root inside it.
#
# Client -> helper, on a stream socket: 8 bytes (the request's length, big-endian) sent with the
# client's fds 0, 1 and 2 (SCM_RIGHTS), then the request as JSON: {"argv": [...], "env": {...},
# "cwd": "...", "user": "root"}. Then lines "signal N" (forwarded signals). Helper -> client: one
# line, "exit N" or "signal N", when the command has ended. A client that goes away takes its
# command (and the command's process group) with it.

ROOT_HELPER_SOCKET = "\0evervm-sudo"
ROOT_HELPER_MAX_REQUEST = 4 * 1024 * 1024
ROOT_HELPER_MAX_CLIENTS = 64


def start_root_helper(uid, gid):
    """Forks the helper (which never returns) and makes this process `uid`/`gid` for good."""
    import socket

    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(ROOT_HELPER_SOCKET)
        listener.listen(16)
        pid = os.fork()
        if pid == 0:
            try:
                _root_helper(listener)
            finally:
                os._exit(0)
        listener.close()
    finally:
        # Whatever happened above, the agent (and the user's code) never stays root.
        os.setgroups([gid])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)


def _root_helper(listener):
    import socket

    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    for fd in (CHAN_IN, CHAN_OUT):
        os.close(fd)
    os.setsid()
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_IGN)
    clients = set()
    while True:
        conn, _ = listener.accept()
        while clients:
            ended, _ = os.waitpid(-1, os.WNOHANG)
            if ended == 0:
                break
            clients.discard(ended)
        if len(clients) >= ROOT_HELPER_MAX_CLIENTS:
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            try:
                _serve_sudo(conn)
            except BaseException:
                pass
            os._exit(0)
        clients.add(pid)
        conn.close()


def _recv_request(conn):
    import socket

    header, fds, _, _ = socket.recv_fds(conn, 8, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None, []
    while len(header) < 8:
        more = conn.recv(8 - len(header))
        if not more:
            break
        header += more
    if len(header) != 8:
        return None, fds
    size = struct.unpack(">Q", header)[0]
    if size > ROOT_HELPER_MAX_REQUEST:
        return None, fds
    body = bytearray()
    while len(body) < size:
        more = conn.recv(min(65536, size - len(body)))
        if not more:
            return None, fds
        body += more
    try:
        request = json.loads(bytes(body))
    except ValueError:
        return None, fds
    return request, fds


def _serve_sudo(conn):
    """One `sudo`: runs its command as asked and answers how it ended."""
    import pwd

    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)
    request, fds = _recv_request(conn)
    argv = request.get("argv") if isinstance(request, dict) else None
    if (not isinstance(argv, list) or not argv
            or not all(isinstance(a, str) and "\0" not in a for a in argv)):
        conn.sendall(b"exit 1\n")
        return
    env = request.get("env")
    if not isinstance(env, dict):
        env = {}
    env = {k: v for k, v in env.items()
           if isinstance(k, str) and isinstance(v, str) and k and "=" not in k
           and "\0" not in k and "\0" not in v}
    cwd = request.get("cwd") if isinstance(request.get("cwd"), str) else "/"
    try:
        user = pwd.getpwnam(str(request.get("user") or "root"))
    except KeyError:
        os.write(fds[2], b"sudo: unknown user %s\n" % str(request.get("user")).encode())
        conn.sendall(b"exit 1\n")
        return
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    child = os.fork()
    if child == 0:
        try:
            os.setpgid(0, 0)
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(3, 65536)
            signal.set_wakeup_fd(-1)
            for number in range(1, signal.NSIG):
                try:
                    signal.signal(number, signal.SIG_DFL)
                except (OSError, ValueError, RuntimeError):
                    pass
            os.setgroups([user.pw_gid])
            os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
            os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
            try:
                os.chdir(cwd)
            except OSError:
                os.chdir(user.pw_dir if os.path.isdir(user.pw_dir) else "/")
            os.execvpe(argv[0], argv, env)
        except FileNotFoundError:
            os.write(2, b"sudo: %s: command not found\n" % argv[0].encode(errors="replace"))
            os._exit(127)
        except BaseException as exc:
            os.write(2, b"sudo: %s: %s\n" % (argv[0].encode(errors="replace"),
                                             str(exc).encode(errors="replace")))
        os._exit(126)
    for fd in fds:
        os.close(fd)
    pending = b""
    while True:
        ended, status = os.waitpid(child, os.WNOHANG)
        if ended:
            break
        try:
            ready, _, _ = select.select([conn, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        if conn in ready:
            data = conn.recv(4096)
            if not data:
                # The client went away: so does its command.
                try:
                    os.killpg(child, signal.SIGKILL)
                except OSError:
                    pass
                os.waitpid(child, 0)
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                parts = line.split()
                if len(parts) == 2 and parts[0] == b"signal" and parts[1].isdigit():
                    try:
                        os.killpg(child, int(parts[1]))
                    except (OSError, ValueError):
                        pass
            pending = pending[-256:]
    if os.WIFSIGNALED(status):
        answer = b"signal %d\n" % os.WTERMSIG(status)
    else:
        answer = b"exit %d\n" % os.waitstatus_to_exitcode(status)
    try:
        conn.sendall(answer)
    except OSError:
        pass
