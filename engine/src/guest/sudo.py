#!/usr/bin/python3 -I
"""sudo for an evervm machine: runs a command as root (or `-u USER`) without a password.

gVisor ignores set-user-ID bits, so this asks the machine's root helper (the agent's, see
`root.py` in evervm's sources) to run the command, handing it this process's stdin, stdout and
stderr. Signals sent to sudo reach the command; sudo ends as the command did.
"""

import json
import os
import signal
import socket
import struct
import sys

SOCKET = "\0evervm-sudo"
SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KEPT = ("TERM", "LANG", "LANGUAGE", "TZ", "COLORS", "LS_COLORS", "DISPLAY", "PYTHONIOENCODING")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCONT, signal.SIGWINCH)
USAGE = """usage: sudo [-EHknSs] [-i] [-u user] [-D directory] [--] [VAR=value] command [args]
       sudo -l | -v | -k | -K | -V | -h
Runs a command as root (or as -u user) in this machine, without a password.
  -E, --preserve-env   keep the environment (else a clean one, as sudo's env_reset)
  -u, --user=USER      run as USER instead of root
  -D, --chdir=DIR      run in DIR
  -s, --shell          run the command (or an interactive shell) through /bin/sh
  -i, --login          as -s, in the target user's home, as a login shell
  -H, -n, -S, -k       accepted; there is no password to ask or remember
"""


def fail(message, code=1):
    sys.stderr.write("sudo: %s\n" % message)
    sys.exit(code)


def parse(args):
    options = {"user": "root", "preserve": False, "shell": False, "login": False, "chdir": None}
    while args:
        arg = args[0]
        if arg == "--":
            args = args[1:]
            break
        if not arg.startswith("-") or arg == "-":
            break
        args = args[1:]
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            if name in ("user", "chdir"):
                if not value:
                    if not args:
                        fail("option '--%s' requires an argument" % name)
                    value, args = args[0], args[1:]
                options[name] = value
            elif name == "preserve-env":
                options["preserve"] = True
            elif name in ("set-home", "non-interactive", "stdin", "reset-timestamp"):
                pass
            elif name == "shell":
                options["shell"] = True
            elif name == "login":
                options["login"] = True
            elif name in ("help", "version", "list", "validate", "remove-timestamp"):
                options["action"] = name
            else:
                fail("unrecognized option '--%s'\n%s" % (name, USAGE.rstrip()))
            continue
        letters = arg[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            if letter in "uD":
                value = letters
                letters = ""
                if not value:
                    if not args:
                        fail("option requires an argument -- '%s'" % letter)
                    value, args = args[0], args[1:]
                options["user" if letter == "u" else "chdir"] = value
            elif letter == "E":
                options["preserve"] = True
            elif letter in "HnSkP":
                pass
            elif letter == "s":
                options["shell"] = True
            elif letter == "i":
                options["login"] = True
            elif letter in "hVlvK":
                options["action"] = {"h": "help", "V": "version", "l": "list", "v": "validate",
                                     "K": "remove-timestamp"}[letter]
            else:
                fail("invalid option -- '%s'\n%s" % (letter, USAGE.rstrip()))
    return options, args


def environment(options, assignments, user):
    if options["preserve"]:
        env = dict(os.environ)
    else:
        env = {k: v for k, v in os.environ.items() if k in KEPT or k.startswith("LC_")}
        env["PATH"] = SECURE_PATH
    env.update({
        "HOME": user["home"],
        "USER": user["name"],
        "LOGNAME": user["name"],
        "SHELL": "/bin/sh",
        "SUDO_USER": os.environ.get("USER") or str(os.getuid()),
        "SUDO_UID": str(os.getuid()),
        "SUDO_GID": str(os.getgid()),
    })
    env.update(assignments)
    return env


def main():
    import pwd

    options, args = parse(sys.argv[1:])
    action = options.get("action")
    if action == "help":
        sys.stdout.write(USAGE)
        return 0
    if action == "version":
        sys.stdout.write("Sudo version 1.9 (evervm: no password; gVisor is the boundary)\n")
        return 0
    if action == "list":
        sys.stdout.write("User %s may run the following commands on this machine:\n"
                         "    (ALL : ALL) NOPASSWD: ALL\n" % pwd.getpwuid(os.getuid()).pw_name)
        return 0
    if action in ("validate", "remove-timestamp"):
        return 0
    assignments = {}
    while args and "=" in args[0] and not args[0].startswith("="):
        name, _, value = args[0].partition("=")
        assignments[name] = value
        args = args[1:]
    try:
        target = pwd.getpwnam(options["user"])
    except KeyError:
        fail("unknown user %s" % options["user"])
    user = {"name": target.pw_name, "home": target.pw_dir}
    if options["shell"] or options["login"]:
        argv = ["/bin/sh"] + (["-l"] if options["login"] else [])
        if args:
            argv += ["-c", " ".join(args)]
    elif not args:
        fail(USAGE.rstrip())
    else:
        argv = args
    cwd = options["chdir"] or (user["home"] if options["login"] else os.getcwd())
    env = environment(options, assignments, user)
    env["SUDO_COMMAND"] = " ".join(argv)[:4096]
    body = json.dumps({"argv": argv, "env": env, "cwd": cwd, "user": user["name"]}).encode()

    helper = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        helper.connect(SOCKET)
    except OSError:
        fail("root is not available in this machine (only gVisor machines made since sudo came "
             "have it)")
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    socket.send_fds(helper, [struct.pack(">Q", len(body))], fds)
    helper.sendall(body)

    def forward(number, _frame):
        try:
            helper.sendall(b"signal %d\n" % number)
        except OSError:
            pass

    for number in FORWARDED:
        signal.signal(number, forward)
    answer = b""
    while b"\n" not in answer:
        data = helper.recv(256)
        if not data:
            fail("the root helper went away before the command ended")
        answer += data
    kind, _, value = answer.split(b"\n", 1)[0].partition(b" ")
    if kind == b"signal" and value.isdigit():
        number = int(value)
        sys.stdout.flush()
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return 128 + number
    if kind == b"exit" and value.lstrip(b"-").isdigit():
        return int(value) & 0xFF
    fail("the root helper gave an answer sudo does not know: %r" % answer[:100])


if __name__ == "__main__":
    sys.exit(main())
