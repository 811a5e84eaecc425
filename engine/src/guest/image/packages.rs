//! Which Debian packages an image is made of: the dependency closure of a profile's roots, read
//! from `apt-cache`, minus what a machine never uses.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

use super::Package;
use crate::error::{Error, Result};

/// Packages never taken into an image although something depends on them: package tools,
/// compilers, headers and GUI toolkits that Python code in a machine does not use.
pub(super) const NEVER: &[&str] = &[
    "perl",
    "perl-base",
    "perl-modules-5.36",
    "libperl5.36",
    "dpkg",
    "install-info",
    "tar",
    "mailcap",
    "mime-support",
    "debconf",
    "readline-common",
    "libselinux1",
    "libacl1",
    "gcc-12-base",
    "sysvinit-utils",
    "lsb-base",
    // Compilers and development files (pythran and the -dev packages pull them in).
    "python3-pythran",
    "python3-dev",
    "python3.11-dev",
    "python3-all",
    "python3-all-dev",
    "libpython3-dev",
    "libpython3.11-dev",
    "libpython3-all-dev",
    "gcc",
    "gcc-12",
    "g++",
    "g++-12",
    "cpp",
    "cpp-12",
    "binutils",
    "linux-libc-dev",
    "libc6-dev",
    "libc-dev-bin",
    "rpcsvc-proto",
    "libgcc-12-dev",
    "libstdc++-12-dev",
    "zlib1g-dev",
    "libexpat1-dev",
    "python3-distutils",
    "python3-lib2to3",
    // Tk and X11: no display in a machine.
    "python3-tk",
    "python3-pil.imagetk",
    "tk8.6-blt2.5",
    "blt",
    "x11-common",
    // Large optional extras.
    "python3-scipy",
    "python3-sympy",
    "python3-mpmath",
    "unicode-data",
    "fonts-lyx",
    "python3-lxml",
    "python3-fs",
    "python3-ufolib2",
    "libxml2",
    "libxslt1.1",
    "libicu72",
    "libjs-jquery",
    "libjs-jquery-ui",
    "javascript-common",
];

pub(super) fn run(command: &mut Command, what: &str) -> Result<String> {
    let output = command.output().map_err(|e| {
        Error::unsupported(format!(
            "{what}: cannot run {}: {e} (the image builder needs apt-get, apt-cache and dpkg: \
             run it on Debian or Ubuntu)",
            command.get_program().display()
        ))
    })?;
    if !output.status.success() {
        return Err(Error::internal(format!(
            "{what} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

pub(super) fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// Parses `apt-cache depends --recurse` output into each package's dependency groups (each group
/// a list of alternatives, virtual packages replaced by their first provider).
pub(super) fn parse_depends(text: &str) -> HashMap<String, Vec<Vec<String>>> {
    let mut graph: HashMap<String, Vec<Vec<String>>> = HashMap::new();
    let mut current: Option<String> = None;
    let mut open_alternative = false;
    let mut virtual_pending = false;
    for line in text.lines() {
        if !line.starts_with(' ') {
            let name = line.trim().to_owned();
            graph.entry(name.clone()).or_default();
            current = Some(name);
            open_alternative = false;
            virtual_pending = false;
            continue;
        }
        let Some(package) = current.clone() else {
            continue;
        };
        let trimmed = line.trim_start();
        let (alternative, rest) = match trimmed.strip_prefix('|') {
            Some(rest) => (true, rest),
            None => (false, trimmed),
        };
        let dep = rest
            .strip_prefix("Depends: ")
            .or_else(|| rest.strip_prefix("PreDepends: "));
        let groups = graph.entry(package).or_default();
        match dep {
            Some(dep) => {
                let dep = dep.trim();
                virtual_pending = dep.starts_with('<');
                let name = if virtual_pending {
                    String::new()
                } else {
                    dep.to_owned()
                };
                if open_alternative {
                    if let Some(group) = groups.last_mut() {
                        group.push(name);
                    }
                } else {
                    groups.push(vec![name]);
                }
                open_alternative = alternative;
            }
            None => {
                // A provider of the virtual package just named: take the first.
                if virtual_pending && !rest.contains(':') {
                    if let Some(slot) = groups.last_mut().and_then(|g| g.last_mut())
                        && slot.is_empty()
                    {
                        rest.trim().clone_into(slot);
                    }
                    virtual_pending = false;
                }
            }
        }
    }
    graph
}

/// The packages reached from `roots` through the first installable alternative of each
/// dependency, never entering `never`.
pub(super) fn closure(
    graph: &HashMap<String, Vec<Vec<String>>>,
    roots: &[&str],
    never: &[&str],
) -> BTreeSet<String> {
    // What is asked for is always taken: the deny list is for what comes as a dependency.
    let asked: BTreeSet<&str> = roots.iter().copied().collect();
    let never: BTreeSet<&str> = never
        .iter()
        .copied()
        .filter(|n| !asked.contains(n))
        .collect();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<String> = roots.iter().map(|r| (*r).to_owned()).collect();
    while let Some(package) = stack.pop() {
        if never.contains(package.as_str()) || !seen.insert(package.clone()) {
            continue;
        }
        for group in graph.get(&package).into_iter().flatten() {
            if let Some(choice) = group.iter().find(|p| !p.is_empty()) {
                stack.push(choice.clone());
            }
        }
    }
    seen
}

/// Reads `apt-cache show` records: name, version, sha256, file name.
pub(super) fn parse_show(text: &str) -> Vec<Package> {
    let mut packages = Vec::new();
    for record in text.split("\n\n") {
        let mut fields: HashMap<&str, &str> = HashMap::new();
        for line in record.lines() {
            if let Some((key, value)) = line.split_once(": ") {
                fields.entry(key).or_insert(value.trim());
            }
        }
        let (Some(name), Some(version), Some(sha256), Some(arch)) = (
            fields.get("Package"),
            fields.get("Version"),
            fields.get("SHA256"),
            fields.get("Architecture"),
        ) else {
            continue;
        };
        // The name `apt-get download` saves the file under (an epoch's ':' escaped).
        let file = format!("{name}_{}_{arch}.deb", version.replace(':', "%3a"));
        packages.push(Package {
            name: (*name).to_owned(),
            version: (*version).to_owned(),
            sha256: (*sha256).to_owned(),
            file,
        });
    }
    packages
}
