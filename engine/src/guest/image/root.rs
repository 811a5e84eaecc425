//! The root filesystem after unpacking: what maintainer scripts would have done, pruning,
//! precompiling, and the checks that every library resolves and Python starts.

use std::path::{Path, PathBuf};
use std::process::Command;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::packages::run;
use super::{
    AGENT_PATH, LEGACY_HOME, MACHINE_HOME, MACHINE_UID, MACHINE_USER, MPLCONFIGDIR, NSSWITCH_CONF,
    Profile, SUDO_PATH,
};
use crate::error::{Error, Result};
use crate::guest::{AGENT_SOURCE, SUDO_SOURCE};

/// Directories removed from the root: documentation, locales, and parts of the standard library
/// that need a display or a compiler.
pub(super) const PRUNE: &[&str] = &[
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/lib/python3.11/idlelib",
    "usr/lib/python3.11/tkinter",
    "usr/lib/python3.11/lib2to3",
    "usr/lib/python3.11/ensurepip",
    "usr/lib/python3.11/turtledemo",
    "usr/lib/python3.11/test",
];

pub(super) fn tree_size(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if meta.is_dir() {
        std::fs::read_dir(path).map_or(0, |entries| {
            entries.flatten().map(|e| tree_size(&e.path())).sum()
        })
    } else {
        meta.len()
    }
}

pub(super) fn symlink(target: &str, link: &Path) -> Result<()> {
    if std::fs::symlink_metadata(link).is_ok() {
        return Ok(());
    }
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::os::unix::fs::symlink(target, link)
        .map_err(|e| Error::internal(format!("cannot link {}: {e}", link.display())))
}

pub(super) fn write_file(root: &Path, path: &str, contents: &str) -> Result<()> {
    let full = root.join(path.trim_start_matches('/'));
    if let Some(parent) = full.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&full, contents)
        .map_err(|e| Error::internal(format!("cannot write {}: {e}", full.display())))
}

/// Everything `dpkg -x` does not do: links a maintainer script or `update-alternatives` would
/// make, the files of a minimal system, the agent, and pruning.
pub(super) fn configure_root(root: &Path, profile: &Profile) -> Result<()> {
    for dir in PRUNE {
        let path = root.join(dir);
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
    }
    symlink("python3.11", &root.join("usr/bin/python3"))?;
    symlink("python3", &root.join("usr/bin/python"))?;
    // busybox applets for what code reaches through a shell (`os.system`, `subprocess`).
    let applets = run(
        Command::new(root.join("bin/busybox")).arg("--list"),
        "listing busybox applets",
    )?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        let in_bin = root.join("bin").join(applet);
        let in_usr_bin = root.join("usr/bin").join(applet);
        if std::fs::symlink_metadata(&in_usr_bin).is_err() {
            symlink("/bin/busybox", &in_bin)?;
        }
    }
    // update-alternatives would make these for BLAS and LAPACK.
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    for (name, dir) in [("libblas.so.3", "blas"), ("liblapack.so.3", "lapack")] {
        if lib.join(dir).join(name).exists() {
            symlink(&format!("{dir}/{name}"), &lib.join(name))?;
        }
    }
    // E2B's user and home: code written for E2B's sandboxes finds `/home/user` and `user`.
    write_file(
        root,
        "/etc/passwd",
        &format!(
            "root:x:0:0:root:/root:/bin/sh\n{MACHINE_USER}:x:{MACHINE_UID}:{MACHINE_UID}::\
             {MACHINE_HOME}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
        ),
    )?;
    write_file(
        root,
        "/etc/group",
        &format!(
            "root:x:0:\nsudo:x:27:{MACHINE_USER}\n{MACHINE_USER}:x:{MACHINE_UID}:\n\
             nogroup:x:65534:\n"
        ),
    )?;
    write_file(root, "/etc/hostname", "machine\n")?;
    write_file(
        root,
        "/etc/hosts",
        "127.0.0.1\tlocalhost machine\n::1\tlocalhost\n",
    )?;
    write_file(root, "/etc/nsswitch.conf", NSSWITCH_CONF)?;
    if root.join("usr/share/zoneinfo/Etc/UTC").exists() {
        symlink("/usr/share/zoneinfo/Etc/UTC", &root.join("etc/localtime"))?;
    }
    let home = MACHINE_HOME.trim_start_matches('/');
    for dir in ["tmp", "proc", "dev", "sys", "root", home, "opt/evervm"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    std::fs::set_permissions(root.join("root"), std::fs::Permissions::from_mode(0o700))?;
    std::os::unix::fs::chown(root.join(home), Some(MACHINE_UID), Some(MACHINE_UID))?;
    // The home of images before this one, for code that still names it.
    symlink(
        MACHINE_USER,
        &root.join(LEGACY_HOME.trim_start_matches('/')),
    )?;
    write_file(root, SUDO_PATH, SUDO_SOURCE)?;
    std::fs::set_permissions(
        root.join(SUDO_PATH.trim_start_matches('/')),
        std::fs::Permissions::from_mode(0o755),
    )?;
    write_file(root, AGENT_PATH, AGENT_SOURCE)?;
    if *profile == Profile::Data {
        write_file(
            root,
            &format!("{MPLCONFIGDIR}/matplotlibrc"),
            "backend: Agg\n",
        )?;
    }
    write_ca_bundle(root)?;
    // pip installs into the machine's user site-packages: the image is the machine's own, so
    // Debian's marker (PEP 668) that makes pip refuse to install at all is taken out.
    let managed = root.join("usr/lib/python3.11/EXTERNALLY-MANAGED");
    if managed.exists() {
        std::fs::remove_file(managed)?;
    }
    Ok(())
}

/// The certificate bundle `update-ca-certificates` would make from the `ca-certificates`
/// package (Debian's `certifi`, hence `requests`, reads it).
fn write_ca_bundle(root: &Path) -> Result<()> {
    let dir = root.join("usr/share/ca-certificates/mozilla");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "crt"))
        .collect();
    files.sort();
    let mut bundle = String::new();
    for file in files {
        let pem = std::fs::read_to_string(&file)?;
        bundle.push_str(pem.trim_end());
        bundle.push('\n');
    }
    write_file(root, "/etc/ssl/certs/ca-certificates.crt", &bundle)
}

/// Runs a program inside the image root (chroot; through a user namespace when not root).
pub(super) fn in_root(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let as_root = unsafe { libc::geteuid() } == 0;
    let chroot = ["/usr/sbin/chroot", "/usr/bin/chroot", "/sbin/chroot"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("chroot");
    let mut command = if as_root {
        Command::new(chroot)
    } else {
        let mut c = Command::new("unshare");
        c.args(["--user", "--map-root-user", chroot]);
        c
    };
    command
        .arg(root)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("HOME", "/root");
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

pub(super) fn precompile(root: &Path, profile: &Profile) -> Result<()> {
    let mut dirs = vec!["/usr/lib/python3.11", "/opt/evervm"];
    // A custom image's wheels.
    if root.join("usr/local/lib/python3.11/dist-packages").is_dir() {
        dirs.push("/usr/local/lib/python3.11/dist-packages");
    }
    if *profile == Profile::Data {
        dirs.push("/usr/lib/python3/dist-packages");
    }
    let mut args = vec!["/usr/bin/python3.11", "-m", "compileall", "-q", "-j", "1"];
    args.extend(dirs);
    run(&mut in_root(root, &args, &[]), "precompiling Python files")?;
    if *profile == Profile::Data {
        // Builds matplotlib's font cache once, into the image.
        run(
            &mut in_root(
                root,
                &[
                    "/usr/bin/python3.11",
                    "-c",
                    "import matplotlib.font_manager",
                ],
                &[("MPLCONFIGDIR", MPLCONFIGDIR), ("MPLBACKEND", "Agg")],
            ),
            "building matplotlib's font cache",
        )?;
        // The machine's user owns matplotlib's directory: matplotlib only uses a directory it
        // may write (else it warns on stderr, in every machine, and rebuilds the font cache in
        // a temporary one). Writes land in the sandbox's own overlay, never in the image.
        chown_tree(
            &root.join(MPLCONFIGDIR.trim_start_matches('/')),
            MACHINE_UID,
        )?;
    }
    Ok(())
}

/// Gives `dir` and everything under it to `uid` (and its group), without following symlinks.
fn chown_tree(dir: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(dir)?.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

pub(super) fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

pub(super) fn collect_objects(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            // A wheel's vendored libraries (auditwheel's `<name>.libs`) are loaded only by its
            // extension modules, whose search path finds what they need: they are checked
            // through those modules, never alone (alone, `libgfortran` misses `libquadmath`).
            if path.extension().is_none_or(|e| e != "libs") {
                collect_objects(root, &path, found);
            }
        } else if meta.is_file()
            && path.to_string_lossy().contains(".so")
            && is_elf(&path)
            && let Ok(inside) = path.strip_prefix(root)
        {
            found.push(Path::new("/").join(inside));
        }
    }
}

/// Asks the image's own dynamic loader about the interpreter and every extension module, and
/// fails naming each library that cannot be found.
pub(super) fn check_libraries(root: &Path) -> Result<()> {
    let mut objects = vec![PathBuf::from("/usr/bin/python3.11")];
    collect_objects(
        root,
        &root.join("usr/lib/python3.11/lib-dynload"),
        &mut objects,
    );
    collect_objects(
        root,
        &root.join("usr/lib/python3/dist-packages"),
        &mut objects,
    );
    // Wheels (the data image's, a custom image's).
    collect_objects(
        root,
        &root.join("usr/local/lib/python3.11/dist-packages"),
        &mut objects,
    );
    let mut missing: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for chunk in objects.chunks(64) {
        let mut script = String::new();
        for object in chunk {
            let _ = writeln!(
                script,
                "echo '=== {0}'; /lib64/ld-linux-x86-64.so.2 --list '{0}' 2>&1",
                object.display()
            );
        }
        let output = in_root(root, &["/bin/sh", "-c", &script], &[])
            .output()
            .map_err(|e| Error::internal(format!("cannot run the image's loader: {e}")))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let mut current = String::new();
        for line in text.lines() {
            if let Some(object) = line.strip_prefix("=== ") {
                object.clone_into(&mut current);
            } else if let Some(library) = missing_library(line) {
                missing.entry(library).or_default().insert(current.clone());
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let mut report = String::new();
    for (library, users) in &missing {
        let users: Vec<&str> = users.iter().map(String::as_str).take(3).collect();
        let _ = write!(report, "\n  {library} (needed by {})", users.join(", "));
    }
    Err(Error::internal(format!(
        "the image is missing shared libraries:{report}"
    )))
}

/// The library a line of `ld.so --list` output says is missing, if it says so.
pub(super) fn missing_library(line: &str) -> Option<String> {
    if let Some((library, _)) = line.split_once(" => not found") {
        return Some(library.trim().to_owned());
    }
    let rest = line.split_once("error while loading shared libraries: ")?.1;
    Some(rest.split(':').next().unwrap_or(rest).trim().to_owned())
}

pub(super) fn smoke_test(root: &Path, profile: &Profile) -> Result<()> {
    let mut code = String::from(
        "import ssl, sqlite3, ctypes, decimal, json, readline, lzma, bz2, zlib, hashlib, uuid, \
         asyncio, multiprocessing, curses, dbm\n",
    );
    if *profile == Profile::Data {
        code.push_str(
            "import numpy, pandas, matplotlib, matplotlib.pyplot as plt, requests, bs4, yaml\n\
             import IPython, PIL.Image, pydantic, e2b_charts\n\
             import certifi, os; assert os.path.getsize(certifi.where()) > 100000, certifi.where()\n\
             assert matplotlib.get_backend().lower() == 'agg', matplotlib.get_backend()\n\
             plt.plot([1, 2]); plt.savefig('/tmp/check.png')\n",
        );
    }
    run(
        &mut in_root(
            root,
            &["/usr/bin/python3", "-I", "-c", &code],
            &[("MPLCONFIGDIR", MPLCONFIGDIR), ("MPLBACKEND", "Agg")],
        ),
        "checking the image's Python",
    )?;
    let _ = std::fs::remove_file(root.join("tmp/check.png"));
    Ok(())
}
