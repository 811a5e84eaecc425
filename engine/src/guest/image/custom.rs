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
//! CPython and C library, with what the base image has already (its Debian packages and, for
//! `data`, its pinned wheels) counting as installed, and are unpacked on the host (nothing in
//! them is run) into `/usr/local/lib/python3.11/dist-packages`. A wheel the profile asks for
//! replaces the base's wheel of the same distribution (`numpy==2.3.4` on `data`).

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::wheels::{self, FetchedWheel, LockedWheel, SITE_PACKAGES};
use super::{Image, ImageBuilder, Package, Profile, StderrProgress};
use crate::error::{Error, Result};
use crate::packages::PackageSettings;
use crate::packages::resolve::parse_requested;

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
    refuse_debian_numpy(&spec, &debian)?;
    // The base's own wheels (the data image's stack) go into the custom image too.
    let base_wheels = {
        let builder = builder.clone();
        let (base, debian) = (spec.base.clone(), debian.clone());
        blocking(move || builder.fetch_pinned(&base, &debian)).await?
    };
    let mut own: Vec<FetchedWheel> = Vec::new();
    if !spec.wheels.is_empty() {
        eprintln!("evervm image: resolving {} wheels", spec.wheels.len());
        let mut installed =
            wheels::installed_in(&base_image.root.join("usr/lib/python3/dist-packages"));
        installed.extend(wheels::installed_in(&base_image.root.join(SITE_PACKAGES)));
        let machine = wheels::image_python(&debian, installed)?;
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
        let cache = wheel_cache.clone();
        let settings = settings.clone();
        own = blocking(move || {
            wheels::fetch(&settings, &cache, machine, requirements).map(wheels::planned)
        })
        .await?;
    }
    let mut wheels: Vec<FetchedWheel> = base_wheels
        .into_iter()
        .filter(|(base, _)| !own.iter().any(|(mine, _)| mine.name == base.name))
        .collect();
    wheels.extend(own.iter().cloned());
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
            if let Some(image) = ImageBuilder::load(&dir, &id, &profile, false)? {
                eprintln!("evervm image: {id} is built already");
                return Ok(image);
            }
            let _turn = builder.build_lock()?;
            if let Some(image) = ImageBuilder::load(&dir, &id, &profile, false)? {
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
        wheels: locked_of(&own),
        image: image.id.clone(),
    };
    let text = serde_json::to_vec_pretty(&lock)
        .map_err(|e| Error::internal(format!("cannot encode the lock file: {e}")))?;
    crate::fsutil::write_durably(&lock_file, &text)?;
    Ok((image, lock))
}

/// The data image's numpy is a PyPI wheel (2.x) that takes precedence over Debian's: a Debian
/// package built against Debian's numpy (1.24) would fail to import, so a profile on `data`
/// that brings Debian's numpy is refused, naming the way that works.
fn refuse_debian_numpy(spec: &ImageSpec, debian: &[Package]) -> Result<()> {
    if spec.base != Profile::Data || !debian.iter().any(|p| p.name == "python3-numpy") {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "the Debian packages {:?} bring Debian's numpy 1.24, but the data image's numpy is a \
         newer PyPI wheel that takes its place, so they would not import: take them as wheels \
         (`wheels = [\"scipy\"]`), or build on `base = \"minimal\"`",
        spec.debian
    )))
}

fn locked_of(wheels: &[FetchedWheel]) -> Vec<LockedWheel> {
    wheels.iter().map(|(wheel, _)| wheel.clone()).collect()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("the image build stopped: {e}")))?
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
}
