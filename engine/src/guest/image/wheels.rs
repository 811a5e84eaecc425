//! PyPI wheels in images: the `data` image's pinned stack (`data-wheels.txt`) and a custom
//! image's, fetched through the package index (`crate::packages`) into a cache shared by every
//! home, checked by sha256, and unpacked on the host (nothing in a wheel is run at build).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Package, Profile, in_image_python};
use crate::error::{Error, Result};
use crate::packages::PackageSettings;
use crate::packages::index::PackageIndex;
use crate::packages::resolve::{
    MachinePython, Plan, ReportedEnvironment, parse_requirements, resolve,
};
use crate::packages::wheel::{MAX_WHEEL_ENTRIES, Metadata};

/// Where wheels go in an image.
pub(super) const SITE_PACKAGES: &str = "usr/local/lib/python3.11/dist-packages";
/// The most bytes one wheel may unpack to.
const MAX_UNPACKED_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// The `data` image's wheels, each pinned by version and sha256.
const DATA_WHEELS: &str = include_str!("data-wheels.txt");

/// A wheel in an image, as its manifest and a custom image's lock file record it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedWheel {
    pub name: String,
    pub version: String,
    pub filename: String,
    pub sha256: String,
}

/// A wheel chosen for an image, and where it is in the cache.
pub(super) type FetchedWheel = (LockedWheel, PathBuf);

/// The pinned requirements (`name==version --hash=sha256:...`) a built-in profile's image has
/// as wheels: the `data` image's scientific stack; none for `minimal` (or a custom image, whose
/// wheels come from its profile file).
pub(super) fn pinned(profile: &Profile) -> Vec<&'static str> {
    match profile {
        Profile::Data => DATA_WHEELS
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .collect(),
        Profile::Minimal | Profile::Custom(_) => Vec::new(),
    }
}

/// Resolves requirements for an image's CPython and fetches the wheels into `cache` (on a
/// thread of its own with its own runtime: image builds run on blocking threads, and an
/// `evervm image` command may have no runtime at all).
pub(super) fn fetch(
    settings: &PackageSettings,
    cache: &Path,
    machine: MachinePython,
    requirements: Vec<String>,
) -> Result<Plan> {
    let settings = settings.clone();
    let cache = cache.to_owned();
    let work = move || -> Result<Plan> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::internal(format!("starting the wheel download: {e}")))?;
        runtime.block_on(async move {
            let index = PackageIndex::new(&settings, cache)?;
            resolve(
                &index,
                &machine,
                parse_requirements(&requirements)?,
                settings.max_install_bytes,
            )
            .await
        })
    };
    std::thread::Builder::new()
        .name("evervm-image-wheels".into())
        .spawn(work)
        .map_err(|e| Error::internal(format!("starting the wheel download: {e}")))?
        .join()
        .map_err(|_| Error::internal("the wheel download stopped unexpectedly"))?
}

/// The wheels a plan installs, as an image records them.
pub(super) fn planned(plan: Plan) -> Vec<FetchedWheel> {
    plan.install
        .into_iter()
        .map(|planned| {
            (
                LockedWheel {
                    name: planned.package.name,
                    version: planned.package.version,
                    filename: planned.package.wheel,
                    sha256: planned.package.sha256,
                },
                planned.wheel.path,
            )
        })
        .collect()
}

/// The pinned wheels of a built-in profile, fetched (none for `minimal`).
pub(super) fn fetch_pinned(
    settings: &PackageSettings,
    cache: &Path,
    profile: &Profile,
    debian: &[Package],
) -> Result<Vec<FetchedWheel>> {
    let pins = pinned(profile);
    if pins.is_empty() {
        return Ok(Vec::new());
    }
    let machine = image_python(debian, BTreeMap::new())?;
    let requirements = pins.into_iter().map(str::to_owned).collect();
    fetch(settings, cache, machine, requirements)
        .map(planned)
        .map_err(|e| e.context(format!("the {} image's wheels", profile.as_str())))
}

/// The CPython an image of these Debian packages runs, for wheel resolution (its version and
/// glibc's from the packages), with `installed` counting as installed.
pub(super) fn image_python(
    debian: &[Package],
    installed: BTreeMap<String, String>,
) -> Result<MachinePython> {
    let version_of = |name: &str| {
        debian
            .iter()
            .find(|p| p.name == name)
            .map(|p| {
                p.version
                    .split(['-', '+', '~'])
                    .next()
                    .unwrap_or("")
                    .to_owned()
            })
            .ok_or_else(|| Error::internal(format!("the image has no {name}")))
    };
    let python = version_of("python3.11-minimal")?;
    let glibc = version_of("libc6")?;
    let machine = std::env::consts::ARCH.to_owned();
    let environment = ReportedEnvironment {
        implementation_name: "cpython".into(),
        implementation_version: python.clone(),
        os_name: "posix".into(),
        platform_machine: machine,
        platform_python_implementation: "CPython".into(),
        platform_release: String::new(),
        platform_system: "Linux".into(),
        platform_version: String::new(),
        python_version: python.split('.').take(2).collect::<Vec<_>>().join("."),
        python_full_version: python,
        sys_platform: "linux".into(),
    };
    MachinePython::new(&environment, Some(&format!("glibc {glibc}")), installed)
}

/// The distributions in a site directory: normalised name to version.
pub(super) fn installed_in(dir: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let metadata = match path.extension().and_then(|e| e.to_str()) {
            Some("dist-info") => path.join("METADATA"),
            Some("egg-info") if path.is_dir() => path.join("PKG-INFO"),
            Some("egg-info") => path.clone(),
            _ => continue,
        };
        let Ok(file) = std::fs::File::open(&metadata) else {
            continue;
        };
        let mut text = String::new();
        if file.take(1024 * 1024).read_to_string(&mut text).is_err() {
            continue;
        }
        if let Some(metadata) = Metadata::parse(&text)
            && let Ok(name) = metadata.name.parse::<pep508_rs::PackageName>()
        {
            found.entry(name.to_string()).or_insert(metadata.version);
        }
    }
    found
}

/// Unpacks a wheel into an image root, as pip would for a system install under `/usr/local`:
/// its files into site-packages, `.data/scripts` into `/usr/local/bin`, `.data/data` under
/// `/usr/local`, `.data/headers` under `/usr/local/include`; a RECORD of what was written.
/// Every path is checked to stay where it belongs; nothing in the wheel is run.
pub(super) fn unpack_wheel(path: &Path, root: &Path, filename: &str) -> Result<()> {
    let bad = |what: String| Error::invalid(format!("the wheel {filename} {what}"));
    let io = |e: std::io::Error| Error::internal(format!("unpacking {filename}: {e}"));
    let file = std::fs::File::open(path).map_err(io)?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| bad(format!("is not a zip archive: {e}")))?;
    if archive.len() > MAX_WHEEL_ENTRIES {
        return Err(bad(format!("has more than {MAX_WHEEL_ENTRIES} entries")));
    }
    let names: Vec<String> = archive
        .file_names()
        .filter_map(std::result::Result::ok)
        .map(std::borrow::Cow::into_owned)
        .collect();
    let dist_info = names
        .iter()
        .find_map(|n| {
            n.strip_suffix("/WHEEL")
                .filter(|d| d.ends_with(".dist-info") && !d.contains('/'))
        })
        .map(str::to_owned)
        .ok_or_else(|| bad("has no .dist-info/WHEEL".into()))?;
    let data_dir = format!("{}.data", dist_info.trim_end_matches(".dist-info"));
    let site = root.join(SITE_PACKAGES);
    let local = root.join("usr/local");
    let mut written: Vec<String> = Vec::new();
    let mut total: u64 = 0;
    for index in 0..archive.len() {
        let mut entry = archive
            .by_index(index)
            .map_err(|e| bad(format!("has an unreadable entry: {e}")))?;
        if entry.is_dir() {
            continue;
        }
        let relative = entry
            .enclosed_name()
            .ok_or_else(|| bad(format!("has an unsafe path {:?}", entry.name())))?;
        let parts: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let (base, rest, scheme) = if parts.first() == Some(&data_dir) {
            let Some(scheme) = parts.get(1) else { continue };
            let base = match scheme.as_str() {
                "purelib" | "platlib" => site.clone(),
                "scripts" => local.join("bin"),
                "data" => local.clone(),
                "headers" => local.join("include/python3.11"),
                _ => continue,
            };
            (base, parts[2..].to_vec(), scheme.clone())
        } else {
            (site.clone(), parts.clone(), String::new())
        };
        if rest.is_empty() || (rest.len() == 2 && rest[0] == dist_info && rest[1] == "RECORD") {
            continue;
        }
        let target = rest.iter().fold(base, |path, part| path.join(part));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut out = std::fs::File::create(&target).map_err(io)?;
        let left = MAX_UNPACKED_BYTES.saturating_sub(total);
        let mut source = (&mut entry).take(left + 1);
        let copied = if scheme == "scripts" {
            let mut content = Vec::new();
            source.read_to_end(&mut content).map_err(io)?;
            if let Some(rest) = content.strip_prefix(b"#!python") {
                let mut fixed = b"#!/usr/bin/python3".to_vec();
                fixed.extend_from_slice(rest);
                content = fixed;
            }
            out.write_all(&content).map_err(io)?;
            content.len() as u64
        } else {
            std::io::copy(&mut source, &mut out).map_err(io)?
        };
        total += copied;
        if total > MAX_UNPACKED_BYTES {
            return Err(bad(format!(
                "unpacks to more than {MAX_UNPACKED_BYTES} bytes"
            )));
        }
        let executable = scheme == "scripts" || entry.unix_mode().is_some_and(|m| m & 0o111 != 0);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            &target,
            std::fs::Permissions::from_mode(if executable { 0o755 } else { 0o644 }),
        )
        .map_err(io)?;
        written.push(relative_to(&target, &site));
    }
    let installer = site.join(&dist_info).join("INSTALLER");
    std::fs::write(&installer, "evervm\n").map_err(io)?;
    written.push(relative_to(&installer, &site));
    let record = site.join(&dist_info).join("RECORD");
    written.push(relative_to(&record, &site));
    let mut text = String::new();
    for path in written {
        text.push_str(&path);
        text.push_str(",,\n");
    }
    std::fs::write(&record, text).map_err(io)?;
    Ok(())
}

/// `path` relative to `site` (with `..` where it is outside), as a RECORD writes it.
fn relative_to(path: &Path, site: &Path) -> String {
    let path: Vec<_> = path.components().collect();
    let site: Vec<_> = site.components().collect();
    let common = path.iter().zip(&site).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_owned(); site.len() - common];
    parts.extend(
        path[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// Checks in the image that every wheel's distribution is what Python finds.
pub(super) fn check_wheels(root: &Path, wheels: &[(LockedWheel, PathBuf)]) -> Result<()> {
    let expected: Vec<(String, String)> = wheels
        .iter()
        .map(|(w, _)| (w.name.clone(), w.version.clone()))
        .collect();
    let code = format!(
        "import importlib.metadata as m\n\
         for name, version in {}:\n    \
         assert m.version(name) == version, (name, m.version(name), version)\n",
        serde_json::to_string(&expected)
            .map_err(|e| Error::internal(format!("encoding the wheel check: {e}")))?
    );
    in_image_python(root, &code, "checking the image's wheels")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_paths_are_relative_to_site_packages() {
        let site = Path::new("/r/usr/local/lib/python3.11/dist-packages");
        assert_eq!(relative_to(&site.join("a/b.py"), site), "a/b.py");
        assert_eq!(
            relative_to(Path::new("/r/usr/local/bin/x"), site),
            "../../../bin/x"
        );
    }

    #[test]
    fn the_data_image_pins_every_wheel_by_hash() {
        let pins = pinned(&Profile::Data);
        assert!(pins.iter().any(|p| p.starts_with("e2b-charts==")));
        assert!(pins.iter().any(|p| p.starts_with("numpy==")));
        let parsed =
            parse_requirements(&pins.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>()).unwrap();
        assert_eq!(parsed.len(), pins.len());
        for (requirement, hashes) in parsed {
            assert_eq!(hashes.len(), 1, "{requirement} is not pinned by one sha256");
            assert!(
                requirement.to_string().contains("=="),
                "{requirement} has no exact version"
            );
        }
        assert!(pinned(&Profile::Minimal).is_empty());
    }
}
