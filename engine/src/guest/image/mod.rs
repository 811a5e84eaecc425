//! The root filesystem image machines run on: Debian packages, downloaded with `apt-get download`
//! and unpacked with `dpkg -x` into a read-only root, with CPython 3.11, busybox, the agent and a
//! precompiled standard library. Images live in `$EVERVM_HOME/images/<id>/`, where the id is a
//! hash of every input (the exact package versions, the agent, the builder), so nothing is
//! rebuilt unless an input changed. Downloaded packages are kept in `~/.cache/evervm/debs`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub mod custom;
mod packages;
mod progress;
mod root;
mod wheels;

pub use progress::{Progress, StderrProgress};
pub use wheels::LockedWheel;

use packages::{NEVER, closure, parse_depends, parse_show, run, sha256_file};
use root::{check_libraries, configure_root, in_root, precompile, smoke_test, tree_size};

use super::AGENT_SOURCE;
use crate::error::{Error, Result};
use crate::fsutil::{fsync_dir, write_durably};
use crate::packages::PackageSettings;
use wheels::FetchedWheel;

/// Bumped whenever the builder changes what it puts in an image. Snapshots keep restoring on the
/// image they were taken on, whatever builder made it.
const BUILDER_VERSION: u32 = 6;
/// The first builder whose images have the user `user` (home `/home/user`) and `sudo`: their
/// agent starts as root and keeps a root helper for `sudo` (see `guest/root.py`).
const USER_AND_SUDO_SINCE: u32 = 6;
/// Where the agent lives inside an image.
pub const AGENT_PATH: &str = "/opt/evervm/agent.py";
/// The unprivileged user machines run as inside the sandbox: `user`, as in E2B's sandboxes.
pub const MACHINE_UID: u32 = 1000;
pub const MACHINE_USER: &str = "user";
pub const MACHINE_HOME: &str = "/home/user";
/// The home in images made before the user became `user` (their snapshots still restore).
pub const LEGACY_HOME: &str = "/home/machine";
/// Where an image has `sudo` (`guest/sudo.py`).
pub const SUDO_PATH: &str = "/usr/bin/sudo";
/// matplotlib's configuration and font cache, built into the image.
pub const MPLCONFIGDIR: &str = "/opt/evervm/matplotlib";
/// The image's `/etc/nsswitch.conf`: names from `/etc/hosts` only (a machine has no network
/// unless its sandbox gets one).
pub const NSSWITCH_CONF: &str = "passwd: files\ngroup: files\nhosts: files\n";
/// The `/etc/nsswitch.conf` mounted over the image's in a sandbox with a network: names also
/// from DNS (the machine's DNS server, in the `/etc/resolv.conf` mounted beside it).
pub const NSSWITCH_CONF_WITH_DNS: &str = "passwd: files\ngroup: files\nhosts: files dns\n";

/// What goes into an image: one of the two built-in profiles, or a custom image built from a
/// profile file (`evervm image build FILE`, see [`custom`]) on top of one of them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// CPython 3.11 and its standard library.
    Minimal,
    /// Minimal plus requests, Beautiful Soup, PyYAML and IPython (for Jupyter cells) from
    /// Debian, and E2B's scientific stack as pinned PyPI wheels (`data-wheels.txt`: numpy,
    /// pandas, matplotlib with the non-interactive `Agg` backend, Pillow, pydantic and
    /// `e2b-charts`): the default. Minimal has no IPython: a Jupyter cell there fails saying so.
    Data,
    /// A custom image, by its name.
    Custom(String),
}

/// The longest custom image name.
pub const MAX_IMAGE_NAME_BYTES: usize = 40;

impl Profile {
    /// `minimal`, `data`, or the name of a custom image: a lowercase letter, then lowercase
    /// letters, digits and `-` (at most [`MAX_IMAGE_NAME_BYTES`] bytes, not ending in `-`).
    /// Whether a custom image of that name was built is known only where images are.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "minimal" => Ok(Profile::Minimal),
            "data" => Ok(Profile::Data),
            other if is_image_name(other) => Ok(Profile::Custom(other.to_owned())),
            other => Err(Error::invalid(format!(
                "{other:?} is not an image: use `minimal`, `data`, or the name of a custom image \
                 (lowercase letters, digits and `-`, starting with a letter, at most \
                 {MAX_IMAGE_NAME_BYTES} bytes)"
            ))),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Profile::Minimal => "minimal",
            Profile::Data => "data",
            Profile::Custom(name) => name,
        }
    }

    fn roots(&self) -> Vec<&'static str> {
        let mut roots = vec![
            "python3.11-minimal",
            "libpython3.11-stdlib",
            "busybox-static",
            // `pip install` in a machine with a network (without one, `install` is the way).
            "python3-pip",
        ];
        if *self == Profile::Data {
            // numpy, pandas, matplotlib and Pillow are wheels (`data-wheels.txt`): E2B's
            // `e2b-charts` needs a newer stack than Debian 12's. Their extension modules need
            // the C++ runtime.
            roots.extend([
                "libstdc++6",
                "python3-requests",
                "python3-bs4",
                "python3-yaml",
                // What programs in an E2B sandbox (and E2B's own tests) reach for in a shell:
                // E2B's base image has them. With bash, commands and terminals run in it.
                "curl",
                "bash",
                "git",
                "ncurses-bin",
                "ncurses-base",
                // Jupyter cells (the E2B door's): IPython's own shell runs them.
                "python3-ipython",
            ]);
        }
        roots
    }
}

/// A custom image's name: see [`Profile::parse`].
pub fn is_image_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_IMAGE_NAME_BYTES
        && bytes[0].is_ascii_lowercase()
        && !name.ends_with('-')
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// One exact package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub sha256: String,
    /// The `.deb` file name, as `apt-get download` saves it.
    pub file: String,
}

/// What an image was built from; stored beside it as `manifest.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageManifest {
    pub format: u32,
    pub id: String,
    pub profile: Profile,
    pub builder: u32,
    pub agent_sha256: String,
    pub packages: Vec<Package>,
    pub created_at: String,
    pub root_bytes: u64,
    /// A custom image's base profile (`minimal` or `data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<Profile>,
    /// The image's wheels (`data`'s pinned stack, a custom image's), unpacked into
    /// `/usr/local/lib/python3.11/dist-packages`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wheels: Vec<LockedWheel>,
}

/// A built image.
#[derive(Debug, Clone)]
pub struct Image {
    pub id: String,
    pub profile: Profile,
    /// The root filesystem, never written after the build.
    pub root: PathBuf,
    /// The version of the builder that made it.
    pub builder: u32,
}

impl Image {
    /// Whether its agent starts as root and keeps a root helper for `sudo`, then runs as the
    /// machine's user.
    pub fn has_root_helper(&self) -> bool {
        self.builder >= USER_AND_SUDO_SINCE
    }

    /// The machine's home (and first working directory) in this image.
    pub fn home(&self) -> &'static str {
        if self.has_root_helper() {
            MACHINE_HOME
        } else {
            LEGACY_HOME
        }
    }
}

/// Builds images from Debian packages.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    /// `$EVERVM_HOME/images`.
    images_dir: PathBuf,
    /// Downloaded `.deb` files, shared by every home.
    cache_dir: PathBuf,
    /// Where the `data` image's wheels come from (`EVERVM_PACKAGE_INDEX`).
    packages: PackageSettings,
    /// Downloaded wheels of built-in images, shared by every home.
    wheel_cache: PathBuf,
}

/// `~/.cache/evervm` (or `$XDG_CACHE_HOME/evervm`).
pub fn default_cache_dir() -> PathBuf {
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|c| !c.is_empty()) {
        return PathBuf::from(cache).join("evervm");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
    home.join(".cache/evervm")
}

impl ImageBuilder {
    /// A builder keeping its images in `images_dir` (normally `$EVERVM_HOME/images`).
    pub fn new(images_dir: PathBuf) -> Self {
        Self {
            images_dir,
            cache_dir: default_cache_dir().join("debs"),
            packages: PackageSettings::from_env(),
            wheel_cache: default_cache_dir().join("wheels"),
        }
    }

    /// A built-in profile's pinned wheels, fetched into the shared cache (none for `minimal`).
    fn fetch_pinned(&self, profile: &Profile, debian: &[Package]) -> Result<Vec<FetchedWheel>> {
        wheels::fetch_pinned(&self.packages, &self.wheel_cache, profile, debian)
    }

    /// The exact packages a profile needs today, as the configured Debian archive has them.
    pub fn resolve(&self, profile: &Profile) -> Result<Vec<Package>> {
        self.resolve_roots(&profile.roots())
    }

    /// The exact packages these roots and their dependencies are, as the archive has them.
    pub fn resolve_roots(&self, roots: &[&str]) -> Result<Vec<Package>> {
        let depends = run(
            Command::new("apt-cache")
                .args([
                    "depends",
                    "--recurse",
                    "--no-recommends",
                    "--no-suggests",
                    "--no-conflicts",
                    "--no-breaks",
                    "--no-replaces",
                    "--no-enhances",
                ])
                .args(roots),
            "resolving the image's packages",
        )?;
        let names = closure(&parse_depends(&depends), roots, NEVER);
        let shown = run(
            Command::new("apt-cache")
                .args(["show", "--no-all-versions"])
                .args(&names),
            "reading package versions",
        )?;
        let mut packages = parse_show(&shown);
        packages.sort_by(|a, b| a.name.cmp(&b.name));
        packages.dedup_by(|a, b| a.name == b.name);
        let found: BTreeSet<&str> = packages.iter().map(|p| p.name.as_str()).collect();
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !found.contains(n.as_str()))
            .collect();
        if !missing.is_empty() {
            return Err(Error::unsupported(format!(
                "apt knows no installable version of {missing:?}: run `apt-get update` (as root) \
                 and try again"
            )));
        }
        Ok(packages)
    }

    /// The id of an image built from these packages.
    pub fn image_id(profile: &Profile, packages: &[Package]) -> String {
        Self::image_id_with(profile, packages, &[])
    }

    /// The id of an image built from these packages and (a custom image's) wheels; a built-in
    /// profile's pinned wheels count by their pins.
    fn image_id_with(profile: &Profile, packages: &[Package], wheels: &[LockedWheel]) -> String {
        let mut hasher = Sha256::new();
        hasher.update(format!("evervm-image builder={BUILDER_VERSION}\n"));
        hasher.update(format!("profile={}\n", profile.as_str()));
        hasher.update(format!(
            "agent={}\n",
            hex::encode(Sha256::digest(AGENT_SOURCE))
        ));
        hasher.update(format!(
            "sudo={}\n",
            hex::encode(Sha256::digest(super::SUDO_SOURCE))
        ));
        for package in packages {
            hasher.update(format!(
                "{} {} {}\n",
                package.name, package.version, package.sha256
            ));
        }
        for pin in wheels::pinned(profile) {
            hasher.update(format!("pinned {pin}\n"));
        }
        for wheel in wheels {
            hasher.update(format!("wheel {} {}\n", wheel.filename, wheel.sha256));
        }
        let digest = hex::encode(hasher.finalize());
        format!("{}-{}", profile.as_str(), &digest[..16])
    }

    /// The image for `profile`, built first if it is not there yet. Builds of one images
    /// directory take turns (a lock file), so concurrent engines build an image once.
    pub fn ensure(&self, profile: &Profile, progress: &dyn Progress) -> Result<Image> {
        if let Profile::Custom(name) = profile {
            return self
                .find_built(profile)?
                .ok_or_else(|| not_built(name, &self.images_dir));
        }
        progress.stage("resolving packages", 0);
        let packages = self.resolve(profile)?;
        let id = Self::image_id(profile, &packages);
        let dir = self.images_dir.join(&id);
        if let Some(image) = Self::load(&dir, &id, profile, false)? {
            return Ok(image);
        }
        let _turn = self.build_lock()?;
        if let Some(image) = Self::load(&dir, &id, profile, false)? {
            return Ok(image);
        }
        let pins = wheels::pinned(profile).len();
        if pins > 0 {
            progress.stage(&format!("fetching {pins} wheels"), 0);
        }
        let wheels = self.fetch_pinned(profile, &packages)?;
        self.build(profile, profile, &id, &packages, &wheels, progress)
    }

    /// The newest built image of a profile; if there is none, one built now.
    pub fn built_or_build(&self, profile: &Profile, progress: &dyn Progress) -> Result<Image> {
        if let Some(image) = self.find_built(profile)? {
            return Ok(image);
        }
        // `ensure` waits for any build under way and finds its image.
        self.ensure(profile, progress)
    }

    fn build_lock(&self) -> Result<std::fs::File> {
        std::fs::create_dir_all(&self.images_dir).map_err(|e| {
            Error::internal(format!("cannot create {}: {e}", self.images_dir.display()))
        })?;
        let path = self.images_dir.join(".build.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| Error::internal(format!("cannot open {}: {e}", path.display())))?;
        file.lock()
            .map_err(|e| Error::internal(format!("cannot lock {}: {e}", path.display())))?;
        Ok(file)
    }

    /// A built image by its exact id.
    pub fn by_id(&self, id: &str) -> Result<Image> {
        let profile = Profile::parse(id.rsplit_once('-').map_or("", |(name, _)| name))?;
        Self::load(&self.images_dir.join(id), id, &profile, true)?.ok_or_else(|| {
            Error::new(
                crate::error::ErrorKind::NotFound,
                format!(
                    "image {id} is not in {}: a snapshot needs the image it was taken on",
                    self.images_dir.display()
                ),
            )
        })
    }

    /// The newest image of a profile that is already built, without asking apt.
    pub fn find_built(&self, profile: &Profile) -> Result<Option<Image>> {
        let Ok(entries) = std::fs::read_dir(&self.images_dir) else {
            return Ok(None);
        };
        let mut newest: Option<(String, Image)> = None;
        let agent_digest = hex::encode(Sha256::digest(AGENT_SOURCE));
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with(profile.as_str()) || name.starts_with('.') {
                continue;
            }
            if let Ok(Some(image)) = Self::load(&entry.path(), &name, profile, false) {
                let manifest = std::fs::read_to_string(entry.path().join("manifest.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<ImageManifest>(&t).ok());
                // An image with another agent still restores the snapshots taken on it, but
                // new sandboxes get this engine's agent (the engine rebuilds built-in images;
                // a custom one is used as built: the agent runs from the engine, not the image).
                let custom = matches!(profile, Profile::Custom(_));
                let Some(manifest) = manifest.filter(|m| custom || m.agent_sha256 == agent_digest)
                else {
                    continue;
                };
                let created = manifest.created_at;
                if newest.as_ref().is_none_or(|(c, _)| created > *c) {
                    newest = Some((created, image));
                }
            }
        }
        Ok(newest.map(|(_, image)| image))
    }

    /// The image in `dir` if it is `id`, of `profile`, made by this builder (by any builder
    /// with `any_builder`: a snapshot restores on the image it was taken on).
    fn load(dir: &Path, id: &str, profile: &Profile, any_builder: bool) -> Result<Option<Image>> {
        let manifest_path = dir.join("manifest.json");
        let Ok(text) = std::fs::read_to_string(&manifest_path) else {
            return Ok(None);
        };
        let manifest: ImageManifest = serde_json::from_str(&text).map_err(|e| {
            Error::internal(format!(
                "{} is unreadable ({e}): delete {} and build the image again",
                manifest_path.display(),
                dir.display()
            ))
        })?;
        if manifest.id != id
            || manifest.profile != *profile
            || !(any_builder || manifest.builder == BUILDER_VERSION)
        {
            return Ok(None);
        }
        Ok(Some(Image {
            id: id.to_owned(),
            profile: profile.clone(),
            root: dir.join("rootfs"),
            builder: manifest.builder,
        }))
    }

    fn download(&self, packages: &[Package], progress: &dyn Progress) -> Result<()> {
        std::fs::create_dir_all(&self.cache_dir).map_err(|e| {
            Error::internal(format!("cannot create {}: {e}", self.cache_dir.display()))
        })?;
        let missing: Vec<&Package> = packages
            .iter()
            .filter(|p| {
                let path = self.cache_dir.join(&p.file);
                !(path.is_file() && sha256_file(&path).ok().as_deref() == Some(p.sha256.as_str()))
            })
            .collect();
        progress.stage(
            &format!("downloading {} packages", missing.len()),
            missing.len(),
        );
        for (done, chunk) in missing.chunks(8).enumerate() {
            let specs: Vec<String> = chunk
                .iter()
                .map(|p| format!("{}={}", p.name, p.version))
                .collect();
            progress.step(done * 8, &chunk[0].name);
            run(
                Command::new("apt-get")
                    .arg("download")
                    .args(&specs)
                    .current_dir(&self.cache_dir),
                "downloading packages (apt-get download)",
            )?;
        }
        for package in packages {
            let path = self.cache_dir.join(&package.file);
            let actual = sha256_file(&path).map_err(|e| {
                Error::internal(format!("{} was not downloaded: {e}", path.display()))
            })?;
            if actual != package.sha256 {
                let _ = std::fs::remove_file(&path);
                return Err(Error::internal(format!(
                    "{} does not match its SHA-256 from the archive: removed; run the build again",
                    path.display()
                )));
            }
        }
        progress.step(missing.len(), "");
        Ok(())
    }

    fn build(
        &self,
        profile: &Profile,
        base: &Profile,
        id: &str,
        packages: &[Package],
        wheels: &[FetchedWheel],
        progress: &dyn Progress,
    ) -> Result<Image> {
        self.download(packages, progress)?;
        std::fs::create_dir_all(&self.images_dir)?;
        let staging = self
            .images_dir
            .join(format!(".build-{id}-{}", std::process::id()));
        if staging.exists() {
            std::fs::remove_dir_all(&staging)?;
        }
        let result = self.build_in(profile, base, id, packages, wheels, &staging, progress);
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn build_in(
        &self,
        profile: &Profile,
        base: &Profile,
        id: &str,
        packages: &[Package],
        wheels: &[FetchedWheel],
        staging: &Path,
        progress: &dyn Progress,
    ) -> Result<Image> {
        // A custom image is configured, compiled and checked as its base is.
        let custom_base = matches!(profile, Profile::Custom(_)).then(|| base.clone());
        let root = staging.join("rootfs");
        std::fs::create_dir_all(&root)?;
        progress.stage(
            &format!("unpacking {} packages", packages.len()),
            packages.len(),
        );
        for (done, package) in packages.iter().enumerate() {
            progress.step(done, &package.name);
            run(
                Command::new("dpkg")
                    .arg("-x")
                    .arg(self.cache_dir.join(&package.file))
                    .arg(&root),
                &format!("unpacking {}", package.name),
            )?;
        }
        progress.step(packages.len(), "");
        progress.stage("configuring", 0);
        configure_root(&root, base)?;
        if !wheels.is_empty() {
            progress.stage(&format!("unpacking {} wheels", wheels.len()), wheels.len());
            for (done, (wheel, path)) in wheels.iter().enumerate() {
                progress.step(done, &wheel.name);
                wheels::unpack_wheel(path, &root, &wheel.filename)?;
            }
            progress.step(wheels.len(), "");
        }
        progress.stage("checking shared libraries", 0);
        check_libraries(&root)?;
        progress.stage("precompiling the standard library", 0);
        precompile(&root, base)?;
        smoke_test(&root, base)?;
        if !wheels.is_empty() {
            wheels::check_wheels(&root, wheels)?;
        }

        let manifest = ImageManifest {
            format: 1,
            id: id.to_owned(),
            profile: profile.clone(),
            builder: BUILDER_VERSION,
            agent_sha256: hex::encode(Sha256::digest(AGENT_SOURCE)),
            packages: packages.to_vec(),
            created_at: chrono::Utc::now().to_rfc3339(),
            root_bytes: tree_size(&root),
            base: custom_base,
            wheels: wheels.iter().map(|(wheel, _)| wheel.clone()).collect(),
        };
        let text = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| Error::internal(format!("cannot encode the manifest: {e}")))?;
        write_durably(&staging.join("manifest.json"), &text)?;
        let dir = self.images_dir.join(id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::rename(staging, &dir)?;
        fsync_dir(&self.images_dir)?;
        progress.finish(&format!(
            "built {id} ({} packages, {} MB)",
            packages.len(),
            manifest.root_bytes / 1_000_000
        ));
        Ok(Image {
            id: id.to_owned(),
            profile: profile.clone(),
            root: dir.join("rootfs"),
            builder: BUILDER_VERSION,
        })
    }
}

/// Runs Python code inside an image root; its failure is the build's.
fn in_image_python(root: &Path, code: &str, what: &str) -> Result<()> {
    run(
        &mut in_root(root, &["/usr/bin/python3.11", "-c", code], &[]),
        what,
    )
    .map(|_| ())
}

/// The error for a custom image that was not built here.
fn not_built(name: &str, images_dir: &Path) -> Error {
    Error::invalid(format!(
        "there is no image named {name:?} in {}: the built-in images are `minimal` and `data`; \
         build a custom one with `evervm image build PROFILE.toml`",
        images_dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::root::missing_library;
    use super::*;

    const DEPENDS: &str = "python3.11-minimal
  PreDepends: libc6
  Depends: libpython3.11-minimal
  Depends: libexpat1
 |Depends: libz-alt
  Depends: zlib1g
libpython3.11-minimal
  Depends: libc6
  Depends: <mail-transport-agent>
    exim4
    postfix
libc6
  Depends: libgcc-s1
libgcc-s1
  Depends: gcc-12-base
  Depends: libc6
libexpat1
  Depends: libc6
libz-alt
zlib1g
  Depends: libc6
exim4
";

    #[test]
    fn resolves_first_alternatives_and_providers_and_skips_the_deny_list() {
        let graph = parse_depends(DEPENDS);
        let names = closure(&graph, &["python3.11-minimal"], &["gcc-12-base"]);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "exim4",
                "libc6",
                "libexpat1",
                "libgcc-s1",
                "libpython3.11-minimal",
                "libz-alt",
                "python3.11-minimal",
            ]
        );
    }

    #[test]
    fn a_package_asked_for_is_taken_even_when_denied_as_a_dependency() {
        let graph = parse_depends(DEPENDS);
        let names = closure(&graph, &["libgcc-s1", "gcc-12-base"], &["gcc-12-base"]);
        assert!(names.contains("gcc-12-base"), "{names:?}");
        let names = closure(&graph, &["libgcc-s1"], &["gcc-12-base"]);
        assert!(!names.contains("gcc-12-base"), "{names:?}");
    }

    #[test]
    fn finds_missing_libraries_in_loader_output() {
        assert_eq!(
            missing_library("\tlibmd.so.0 => not found").as_deref(),
            Some("libmd.so.0")
        );
        assert_eq!(
            missing_library(
                "/x.so: error while loading shared libraries: libzstd.so.1: cannot open shared object file"
            )
            .as_deref(),
            Some("libzstd.so.1")
        );
        assert_eq!(missing_library("\tlibc.so.6 => /lib/libc.so.6 (0x1)"), None);
    }

    #[test]
    fn reads_package_records() {
        let text = "Package: busybox-static\nVersion: 1:1.35.0-4\nArchitecture: amd64\nSHA256: abc\n\n\
                    Package: libc6\nVersion: 2.36\nArchitecture: amd64\nSHA256: def\n";
        let packages = parse_show(text);
        assert_eq!(packages.len(), 2);
        assert_eq!(packages[0].file, "busybox-static_1%3a1.35.0-4_amd64.deb");
        assert_eq!(packages[1].version, "2.36");
    }

    #[test]
    fn the_id_changes_with_any_input() {
        let package = Package {
            name: "libc6".into(),
            version: "2.36".into(),
            sha256: "a".into(),
            file: "libc6.deb".into(),
        };
        let one = ImageBuilder::image_id(&Profile::Minimal, std::slice::from_ref(&package));
        let mut newer = package.clone();
        newer.version = "2.37".into();
        assert_ne!(one, ImageBuilder::image_id(&Profile::Minimal, &[newer]));
        assert_ne!(
            one,
            ImageBuilder::image_id(&Profile::Data, std::slice::from_ref(&package))
        );
        assert_eq!(one, ImageBuilder::image_id(&Profile::Minimal, &[package]));
        assert!(one.starts_with("minimal-"));
    }
}
