//! Packages at runtime (`Machine::install`, `%pip install`) against a package index of the
//! test's own on loopback: wheels built here (pure Python, and one with a C extension compiled
//! for the machines' CPython), a project with a source distribution only, and a wheel whose
//! listed sha256 is wrong. The machines themselves have no network.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use evervm::{Client, Machine};
use sha2::{Digest, Sha256};

use crate::value;
use evervm_tests::backends;

/// A wheel: its file name and bytes, made from `files` (path in the archive, contents) plus the
/// dist-info this needs.
pub(crate) fn wheel(
    name: &str,
    version: &str,
    tag: &str,
    requires: &[&str],
    files: &[(&str, Vec<u8>)],
) -> (String, Vec<u8>) {
    let dist = name.replace('-', "_");
    let dist_info = format!("{dist}-{version}.dist-info");
    let mut metadata = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
    for requirement in requires {
        writeln!(metadata, "Requires-Dist: {requirement}").unwrap();
    }
    let wheel_file = format!(
        "Wheel-Version: 1.0\nGenerator: evervm-tests\nRoot-Is-Purelib: {}\nTag: {tag}\n",
        tag.ends_with("-any")
    );
    let mut entries: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|(path, data)| ((*path).to_owned(), data.clone()))
        .collect();
    entries.push((format!("{dist_info}/METADATA"), metadata.into_bytes()));
    entries.push((format!("{dist_info}/WHEEL"), wheel_file.into_bytes()));
    let mut record = String::new();
    for (path, _) in &entries {
        writeln!(record, "{path},,").unwrap();
    }
    writeln!(record, "{dist_info}/RECORD,,").unwrap();
    entries.push((format!("{dist_info}/RECORD"), record.into_bytes()));
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    for (path, data) in entries {
        out.start_file(path, options).unwrap();
        out.write_all(&data).unwrap();
    }
    let bytes = out.finish().unwrap().into_inner();
    (format!("{dist}-{version}-{tag}.whl"), bytes)
}

/// A C extension module `evervm_native._native` with `add(a, b)`, compiled for CPython 3.11
/// (Debian's headers, as in the machines' image).
fn native_extension(dir: &Path) -> Vec<u8> {
    let source = dir.join("native.c");
    std::fs::write(
        &source,
        r#"#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *add(PyObject *self, PyObject *args) {
    long a, b;
    if (!PyArg_ParseTuple(args, "ll", &a, &b)) return NULL;
    return PyLong_FromLong(a + b);
}
static PyMethodDef methods[] = {{"add", add, METH_VARARGS, "a + b, in C"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};
PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
"#,
    )
    .unwrap();
    let library = dir.join("_native.so");
    let built = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-I/usr/include/python3.11", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("cc runs (scripts/setup.sh installs it, and python3.11-dev for Python.h)");
    assert!(built.success(), "compiling the test's C extension failed");
    std::fs::read(library).unwrap()
}

/// A package index: PEP 691 pages and files, from a map of paths to bodies, served on
/// `listener` by a thread (for the life of the test binary). Counts requests, so that a test can
/// see the engine's wheel cache at work.
pub(crate) struct Index {
    pub(crate) url: String,
    requests: Arc<std::sync::atomic::AtomicUsize>,
}

pub(crate) fn serve(
    listener: std::net::TcpListener,
    routes: HashMap<String, Vec<u8>>,
    host: &str,
) -> Index {
    use std::io::Read;

    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    let routes = Arc::new(routes);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let routes = Arc::clone(&routes);
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                    if stream.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let (status, body) = match routes.get(&path) {
                    Some(body) => ("200 OK", body.clone()),
                    None => ("404 Not Found", b"not found".to_vec()),
                };
                let kind = if path.starts_with("/files/") {
                    "application/octet-stream"
                } else {
                    "application/vnd.pypi.simple.v1+json"
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: {kind}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes());
                let _ = stream.write_all(&body);
            });
        }
    });
    Index {
        url: format!("http://{host}:{port}/simple/"),
        requests,
    }
}

/// Adds a project to the index's routes: its page lists `files` (name, bytes, listed sha256 or
/// the real one).
pub(crate) fn project(
    routes: &mut HashMap<String, Vec<u8>>,
    name: &str,
    files: Vec<(String, Vec<u8>, Option<String>)>,
) {
    let mut listed = Vec::new();
    for (file_name, bytes, sha256) in files {
        let sha256 = sha256.unwrap_or_else(|| hex::encode(Sha256::digest(&bytes)));
        listed.push(serde_json::json!({
            "filename": file_name,
            "url": format!("../../files/{file_name}"),
            "hashes": {"sha256": sha256},
            "requires-python": ">=3.8",
        }));
        routes.insert(format!("/files/{file_name}"), bytes);
    }
    let page = serde_json::json!({"meta": {"api-version": "1.1"}, "name": name, "files": listed});
    routes.insert(
        format!("/simple/{name}/"),
        serde_json::to_vec(&page).unwrap(),
    );
}

fn the_index(scratch: &Path) -> Index {
    let mut routes = HashMap::new();
    let helper = wheel(
        "evervm-helper",
        "1.2",
        "py3-none-any",
        &[],
        &[("evervm_helper/__init__.py", b"NAME = 'helper'\n".to_vec())],
    );
    // An older helper that the greeting's `>=1.1` rules out.
    let old_helper = wheel(
        "evervm-helper",
        "1.0",
        "py3-none-any",
        &[],
        &[("evervm_helper/__init__.py", b"NAME = 'old'\n".to_vec())],
    );
    project(
        &mut routes,
        "evervm-helper",
        vec![
            (old_helper.0, old_helper.1, None),
            (helper.0, helper.1, None),
        ],
    );
    let greeting = wheel(
        "evervm-greeting",
        "1.0",
        "py3-none-any",
        &[
            "evervm-helper>=1.1",
            "evervm-never-needed ; python_version < '3'",
        ],
        &[(
            "evervm_greeting/__init__.py",
            b"from evervm_helper import NAME\ndef hello():\n    return 'hello from ' + NAME\n"
                .to_vec(),
        )],
    );
    project(
        &mut routes,
        "evervm-greeting",
        vec![(greeting.0, greeting.1, None)],
    );
    let native = wheel(
        "evervm-native",
        "2.0",
        "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64",
        &[],
        &[
            (
                "evervm_native/__init__.py",
                b"from ._native import add\n".to_vec(),
            ),
            (
                "evervm_native/_native.cpython-311-x86_64-linux-gnu.so",
                native_extension(scratch),
            ),
        ],
    );
    // A wheel for another Python too, which the machine must not take.
    let other_python = wheel(
        "evervm-native",
        "3.0",
        "cp312-cp312-manylinux_2_17_x86_64",
        &[],
        &[("evervm_native/__init__.py", b"raise ImportError\n".to_vec())],
    );
    project(
        &mut routes,
        "evervm-native",
        vec![
            (native.0, native.1, None),
            (other_python.0, other_python.1, None),
        ],
    );
    project(
        &mut routes,
        "evervm-sourceonly",
        vec![(
            "evervm_sourceonly-1.0.tar.gz".to_owned(),
            b"not really a tarball".to_vec(),
            None,
        )],
    );
    let tampered = wheel(
        "evervm-tampered",
        "1.0",
        "py3-none-any",
        &[],
        &[("evervm_tampered.py", b"X = 1\n".to_vec())],
    );
    project(
        &mut routes,
        "evervm-tampered",
        vec![(tampered.0, tampered.1, Some("0".repeat(64)))],
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    serve(listener, routes, "127.0.0.1")
}

async fn engine_on(home: &Path, index: &Index) -> (evervm::engine::Engine, Client) {
    let mut config = crate::gvisor_config(home);
    config.packages.index_url = index.url.clone();
    let engine = evervm::engine::Engine::open(config).await.unwrap();
    let account = engine.ensure_account("local").await.unwrap();
    let client = Client::from_engine(engine.clone(), account);
    (engine, client)
}

async fn error_of(machine: &Machine, requirements: &[&str]) -> String {
    let refused = machine.install(requirements).await.unwrap_err();
    assert_eq!(refused.kind(), evervm::ErrorKind::InvalidInput, "{refused}");
    refused.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn installed_wheels_are_importable_and_survive_swap_fork_and_restart() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let index = the_index(scratch.path());
    let home = tempfile::tempdir().unwrap();
    let (engine, client) = engine_on(home.path(), &index).await;
    let machine = crate::new_machine(&client, Some("minimal")).await;

    // A pure-Python package and its dependency (the newest that satisfies it).
    let report = machine.install(&["evervm-greeting==1.0"]).await.unwrap();
    let installed: Vec<(&str, &str)> = report
        .installed
        .iter()
        .map(|p| (p.name.as_str(), p.version.as_str()))
        .collect();
    assert_eq!(
        installed,
        [("evervm-greeting", "1.0"), ("evervm-helper", "1.2")]
    );
    assert!(report.installed.iter().all(|p| p.sha256.len() == 64));
    assert_eq!(
        value(&machine, "import evervm_greeting; evervm_greeting.hello()").await,
        "'hello from helper'"
    );
    // Again: nothing to do, and the machine says so.
    let again = machine.install(&["evervm-greeting"]).await.unwrap();
    assert!(again.installed.is_empty());
    assert_eq!(again.satisfied.len(), 1);

    // A C extension, through `%pip install` in the REPL; not imported before the swap.
    let pip = machine.exec("%pip install evervm-native").await.unwrap();
    assert_eq!(pip.result.error, None);
    assert!(
        pip.stdout()
            .contains("Successfully installed evervm-native-2.0"),
        "{}",
        pip.stdout()
    );

    // Refusals: a source distribution only, a wheel not matching its sha256, a pin not
    // matching, a project the index does not have, a URL.
    let sdist = error_of(&machine, &["evervm-sourceonly"]).await;
    assert!(
        sdist.contains("no wheel") && sdist.contains("source"),
        "{sdist}"
    );
    let tampered = error_of(&machine, &["evervm-tampered"]).await;
    assert!(tampered.contains("does not match its sha256"), "{tampered}");
    let pinned = error_of(
        &machine,
        &[&format!(
            "evervm-helper==1.2 --hash=sha256:{}",
            "1".repeat(64)
        )],
    )
    .await;
    assert!(pinned.contains("not the pinned"), "{pinned}");
    let unknown = error_of(&machine, &["evervm-nowhere"]).await;
    assert!(unknown.contains("no project"), "{unknown}");
    let url = error_of(&machine, &["x @ https://example.com/x.whl"]).await;
    assert!(url.contains("not from a URL"), "{url}");
    let refused = machine.exec("%pip install --upgrade x").await.unwrap();
    assert!(
        refused
            .result
            .error
            .is_some_and(|e| e.contains("InstallError") && e.contains("--upgrade"))
    );
    assert_eq!(
        value(
            &machine,
            "import importlib.util as u; u.find_spec('evervm_tampered') is None"
        )
        .await,
        "True"
    );

    // Swapped out and back: the extension (never imported) is there.
    machine.swap_out().await.unwrap();
    assert_eq!(
        value(&machine, "import evervm_native; evervm_native.add(40, 2)").await,
        "42"
    );
    // A fork has them too.
    let fork = machine.fork(None).await.unwrap();
    assert_eq!(
        value(&fork, "import evervm_native, evervm_greeting; evervm_native.add(1, 2), evervm_greeting.hello()").await,
        "(3, 'hello from helper')"
    );

    // A restart: a new engine on the same home restores them, and the cached wheels need no
    // new download.
    let name = machine.name().to_owned();
    engine.shutdown().await;
    drop((machine, fork, client, engine));
    let (engine, client) = engine_on(home.path(), &index).await;
    let machine = client.machine(&name);
    assert_eq!(
        value(&machine, "import evervm_native; evervm_native.add(2, 2)").await,
        "4"
    );
    let second = crate::new_machine(&client, Some("minimal")).await;
    let before = index.requests.load(std::sync::atomic::Ordering::SeqCst);
    second.install(&["evervm-helper==1.2"]).await.unwrap();
    let after = index.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        after - before,
        1,
        "only the project page is fetched: the wheel is cached"
    );
    assert_eq!(
        value(&second, "import evervm_helper; evervm_helper.NAME").await,
        "'helper'"
    );
    engine.shutdown().await;
}
