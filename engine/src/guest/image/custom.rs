//! Custom images: a small profile file names a base (`minimal` or `data`), extra Debian packages
//! and PyPI wheels; `evervm image build FILE` builds the image and writes a lock file beside the
//! profile with the exact Debian packages and wheels (versions and sha256) it used. While the
//! profile's wheel list is the one the lock was made for, the next build takes the locked wheels
//! (by version and hash), so a rebuild gives the same image, with the same content-addressed id.
//!
//! ```toml
//! name = "analysis"          # what machines ask for: `image: "analysis"`
//! base = "data"              # or "minimal" (the default)
//! debian = ["python3-scipy"] # extra Debian packages, with their dependencies
//! wheels = ["requests==2.32.3", "polars"]  # PEP 508 requirements; binary wheels only
//! ```
//!
//! Wheels are resolved and checked like `install`'s (`crate::packages`) for the base image's
//! CPython and C library, with what the base image has already counting as installed, and are
//! unpacked on the host (nothing in them is run) into `/usr/local/lib/python3.11/dist-packages`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Image, ImageBuilder, Package, Profile, StderrProgress, in_image_python};
use crate::error::{Error, Result};
use crate::packages::PackageSettings;
use crate::packages::index::PackageIndex;
use crate::packages::resolve::{
    MachinePython, ReportedEnvironment, parse_requested, parse_requirements, resolve,
};
use crate::packages::wheel::{MAX_WHEEL_ENTRIES, Metadata};

/// Where wheels go in an image.
const SITE_PACKAGES: &str = "usr/local/lib/python3.11/dist-packages";
/// The most bytes one wheel may unpack to.
const MAX_UNPACKED_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// The longest profile file read.
const MAX_PROFILE_BYTES: u64 = 64 * 1024;

/// A profile file, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    pub name: String,
    pub base: Profile,
    pub debian: Vec<String>,
    pub wheels: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: String,
    #[serde(default)]
    base: Option<String>,
    #[serde(default)]
    debian: Vec<String>,
    #[serde(default)]
    wheels: Vec<String>,
}

impl ImageSpec {
    pub fn read(path: &Path) -> Result<Self> {
        let bad = |what: String| Error::invalid(format!("{}: {what}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        let mut text = String::new();
        file.take(MAX_PROFILE_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("cannot read it: {e}")))?;
        Self::parse(&text).map_err(|e| bad(e.message().to_owned()))
    }

    pub fn parse(text: &str) -> Result<Self> {
        let raw: RawSpec = toml::from_str(text).map_err(|e| {
            Error::invalid(format!(
                "not an image profile ({}); it holds `name`, and optionally `base`, `debian` \
                 and `wheels`",
                e.message()
            ))
        })?;
        let base = match raw.base.as_deref().unwrap_or("minimal") {
            "minimal" => Profile::Minimal,
            "data" => Profile::Data,
            other => {
                return Err(Error::invalid(format!(
                    "base {other:?}: a custom image is made on `minimal` or `data`"
                )));
            }
        };
        if !matches!(Profile::parse(&raw.name)?, Profile::Custom(_)) {
            return Err(Error::invalid(format!(
                "name {:?} is a built-in image's; choose another",
                raw.name
            )));
        }
        for package in &raw.debian {
            let valid = package.len() <= 128
                && package
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && package
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
            if !valid {
                return Err(Error::invalid(format!(
                    "{package:?} is not a Debian package name"
                )));
            }
        }
        if !raw.wheels.is_empty() {
            parse_requested(&raw.wheels)?;
        }
        Ok(ImageSpec {
            name: raw.name,
            base,
            debian: raw.debian,
            wheels: raw.wheels,
        })
    }
}

/// A wheel in a custom image, as the lock file and the image's manifest record it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedWheel {
    pub name: String,
    pub version: String,
    pub filename: String,
    pub sha256: String,
}

/// What a build used: written beside the profile as `<profile>.lock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageLock {
    pub format: u32,
    pub name: String,
    pub base: Profile,
    /// The profile's `wheels` the lock was made for.
    pub requirements: Vec<String>,
    pub debian: Vec<Package>,
    pub wheels: Vec<LockedWheel>,
    /// The image built.
    pub image: String,
}

/// The lock file of a profile file.
pub fn lock_path(profile: &Path) -> PathBuf {
    profile.with_extension("lock")
}

/// Builds the custom image a profile file describes (or finds it built), and writes its lock
/// file. Progress goes to stderr.
pub async fn build(
    builder: &ImageBuilder,
    settings: &PackageSettings,
    wheel_cache: PathBuf,
    profile_path: &Path,
) -> Result<(Image, ImageLock)> {
    let spec = ImageSpec::read(profile_path)?;
    let lock_file = lock_path(profile_path);
    let lock: Option<ImageLock> = std::fs::read(&lock_file)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let base_image = {
        let builder = builder.clone();
        let base = spec.base.clone();
        blocking(move || builder.ensure(&base, &StderrProgress::default())).await?
    };
    let debian = {
        let builder = builder.clone();
        let mut roots: Vec<String> = spec.base.roots().iter().map(|r| (*r).to_owned()).collect();
        roots.extend(spec.debian.iter().cloned());
        blocking(move || {
            let roots: Vec<&str> = roots.iter().map(String::as_str).collect();
            builder.resolve_roots(&roots)
        })
        .await?
    };
    let mut wheels: Vec<(LockedWheel, PathBuf)> = Vec::new();
    if !spec.wheels.is_empty() {
        eprintln!("evervm image: resolving {} wheels", spec.wheels.len());
        let machine = base_python(&base_image, &debian)?;
        let locked = lock.as_ref().filter(|l| {
            l.requirements == spec.wheels && l.base == spec.base && !l.wheels.is_empty()
        });
        let requirements: Vec<String> = match locked {
            Some(lock) => lock
                .wheels
                .iter()
                .map(|w| format!("{}=={} --hash=sha256:{}", w.name, w.version, w.sha256))
                .collect(),
            None => spec.wheels.clone(),
        };
        let index = PackageIndex::new(settings, wheel_cache)?;
        let plan = resolve(
            &index,
            &machine,
            parse_requirements(&requirements)?,
            settings.max_install_bytes,
        )
        .await?;
        for planned in plan.install {
            wheels.push((
                LockedWheel {
                    name: planned.package.name,
                    version: planned.package.version,
                    filename: planned.package.wheel,
                    sha256: planned.package.sha256,
                },
                planned.wheel.path,
            ));
        }
    }
    let profile = Profile::Custom(spec.name.clone());
    let id = ImageBuilder::image_id_with(&profile, &debian, &locked_of(&wheels));
    let image = {
        let builder = builder.clone();
        let (profile, base, id, debian, wheels) = (
            profile.clone(),
            spec.base.clone(),
            id.clone(),
            debian.clone(),
            wheels.clone(),
        );
        blocking(move || {
            let dir = builder.images_dir.join(&id);
            if let Some(image) = ImageBuilder::load(&dir, &id, &profile)? {
                eprintln!("evervm image: {id} is built already");
                return Ok(image);
            }
            let _turn = builder.build_lock()?;
            if let Some(image) = ImageBuilder::load(&dir, &id, &profile)? {
                return Ok(image);
            }
            builder.build(
                &profile,
                &base,
                &id,
                &debian,
                &wheels,
                &StderrProgress::default(),
            )
        })
        .await?
    };
    let lock = ImageLock {
        format: 1,
        name: spec.name,
        base: spec.base,
        requirements: spec.wheels,
        debian,
        wheels: locked_of(&wheels),
        image: image.id.clone(),
    };
    let text = serde_json::to_vec_pretty(&lock)
        .map_err(|e| Error::internal(format!("cannot encode the lock file: {e}")))?;
    crate::fsutil::write_durably(&lock_file, &text)?;
    Ok((image, lock))
}

fn locked_of(wheels: &[(LockedWheel, PathBuf)]) -> Vec<LockedWheel> {
    wheels.iter().map(|(wheel, _)| wheel.clone()).collect()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("the image build stopped: {e}")))?
}

/// What the base image runs, for wheel resolution: its CPython and glibc from the Debian
/// packages it is made of, and the distributions it has.
fn base_python(base: &Image, debian: &[Package]) -> Result<MachinePython> {
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
    let installed = installed_in(&base.root.join("usr/lib/python3/dist-packages"));
    MachinePython::new(&environment, Some(&format!("glibc {glibc}")), installed)
}

/// The distributions in a site directory: normalised name to version.
fn installed_in(dir: &Path) -> std::collections::BTreeMap<String, String> {
    let mut found = std::collections::BTreeMap::new();
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
    fn profiles_are_checked() {
        let spec = ImageSpec::parse(
            "name = \"analysis\"\nbase = \"data\"\ndebian = [\"python3-six\"]\n\
             wheels = [\"requests==2.32.3\"]\n",
        )
        .unwrap();
        assert_eq!(spec.base, Profile::Data);
        assert_eq!(spec.wheels, ["requests==2.32.3"]);
        assert_eq!(
            ImageSpec::parse("name = \"x\"").unwrap().base,
            Profile::Minimal
        );
        for bad in [
            "name = \"data\"",
            "name = \"Bad\"",
            "name = \"x\"\nbase = \"huge\"",
            "name = \"x\"\ndebian = [\"rm -rf\"]",
            "name = \"x\"\nwheels = [\"x @ https://e.com/x.whl\"]",
            "name = \"x\"\nextra = 1",
            "base = \"data\"",
        ] {
            assert!(ImageSpec::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn record_paths_are_relative_to_site_packages() {
        let site = Path::new("/r/usr/local/lib/python3.11/dist-packages");
        assert_eq!(relative_to(&site.join("a/b.py"), site), "a/b.py");
        assert_eq!(
            relative_to(Path::new("/r/usr/local/bin/x"), site),
            "../../../bin/x"
        );
    }
}
