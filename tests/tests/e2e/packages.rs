//! Packages at runtime (`Machine::install`, `%pip install`) against a package index of the
//! test's own on loopback: wheels built here (pure Python, and one with a C extension compiled
//! for the machines' CPython), a project with a source distribution only, and a wheel whose
//! listed sha256 is wrong. The machines themselves have no network.

use std::path::Path;

use evervm::{Client, Machine};

use crate::value;
use evervm_tests::backends;
use evervm_tests::package_index::{Index, project, serve, wheel};

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

fn the_index(scratch: &Path) -> Index {
    let mut routes = evervm_tests::package_index::Routes::default();
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
    let before = index.requests();
    second.install(&["evervm-helper==1.2"]).await.unwrap();
    let after = index.requests();
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

#[tokio::test(flavor = "multi_thread")]
async fn a_custom_image_with_a_wheel_is_built_used_and_restored() {
    use evervm::engine::guest::image::{ImageBuilder, Profile, custom};

    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let mut routes = evervm_tests::package_index::Routes::default();
    let baked = wheel(
        "evervm-baked",
        "1.0",
        "py3-none-any",
        &[],
        &[("evervm_baked.py", b"WHERE = 'the image'\n".to_vec())],
    );
    project(&mut routes, "evervm-baked", vec![(baked.0, baked.1, None)]);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let index = serve(listener, routes, "127.0.0.1");
    let home = tempfile::tempdir().unwrap();
    let profile = home.path().join("baked.toml");
    std::fs::write(
        &profile,
        "name = \"evervm-test-baked\"\nbase = \"minimal\"\ndebian = [\"python3-six\"]\n\
         wheels = [\"evervm-baked\"]\n",
    )
    .unwrap();
    let mut config = crate::gvisor_config(home.path());
    config.packages.index_url = index.url.clone();
    let builder = ImageBuilder::new(config.images_dir.clone());
    let wheels = home.path().join("wheels");
    let (image, lock) = custom::build(&builder, &config.packages, wheels.clone(), &profile)
        .await
        .unwrap();
    assert!(image.id.starts_with("evervm-test-baked-"), "{}", image.id);
    assert_eq!(lock.wheels.len(), 1);
    assert_eq!(
        (
            lock.wheels[0].name.as_str(),
            lock.wheels[0].version.as_str()
        ),
        ("evervm-baked", "1.0")
    );
    assert!(lock.debian.iter().any(|p| p.name == "python3-six"));
    let written: custom::ImageLock =
        serde_json::from_slice(&std::fs::read(custom::lock_path(&profile)).unwrap()).unwrap();
    assert_eq!(written, lock);
    // Built again from its lock: the same image, nothing rebuilt.
    let (again, _) = custom::build(&builder, &config.packages, wheels, &profile)
        .await
        .unwrap();
    assert_eq!(again.id, image.id);

    // The server's default image, and one a machine asks for by name.
    config.default_image = Profile::Custom("evervm-test-baked".into());
    let engine = evervm::engine::Engine::open(config).await.unwrap();
    let account = engine.ensure_account("local").await.unwrap();
    let client = Client::from_engine(engine.clone(), account);
    let by_default = client
        .create_machine(evervm::CreateMachineOptions::default())
        .await
        .unwrap();
    let named = crate::new_machine(&client, Some("evervm-test-baked")).await;
    let check = "import six, evervm_baked; evervm_baked.WHERE, six.__name__";
    for machine in [&by_default, &named] {
        assert_eq!(value(machine, check).await, "('the image', 'six')");
        assert_eq!(
            machine.info().await.unwrap().image.as_deref(),
            Some("evervm-test-baked")
        );
    }
    named.swap_out().await.unwrap();
    assert_eq!(value(&named, check).await, "('the image', 'six')");
    let unknown = client
        .create_machine(evervm::CreateMachineOptions {
            image: Some("evervm-no-such-image".into()),
            ..evervm::CreateMachineOptions::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.kind(), evervm::ErrorKind::InvalidInput, "{unknown}");
    assert!(
        unknown.to_string().contains("evervm image build"),
        "{unknown}"
    );
    engine.shutdown().await;
}
