//! The root filesystem image machines run on: Debian packages, downloaded with `apt-get download`
//! and unpacked with `dpkg -x` into a read-only root, with CPython 3.11, busybox, the agent and a
//! precompiled standard library. Images live in `$EVERVM_HOME/images/<id>/`, where the id is a
//! hash of every input (the exact package versions, the agent, the builder), so nothing is
//! rebuilt unless an input changed. Downloaded packages are kept in `~/.cache/evervm/debs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::AGENT_SOURCE;
use crate::error::{Error, Result};
use crate::fsutil::{fsync_dir, write_durably};

/// Bumped whenever the builder changes what it puts in an image.
const BUILDER_VERSION: u32 = 1;
/// Where the agent lives inside an image.
pub const AGENT_PATH: &str = "/opt/evervm/agent.py";
/// The unprivileged user machines run as inside the sandbox.
pub const MACHINE_UID: u32 = 1000;
pub const MACHINE_HOME: &str = "/home/machine";
/// matplotlib's configuration and font cache, built into the image.
pub const MPLCONFIGDIR: &str = "/opt/evervm/matplotlib";

/// What goes into an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// CPython 3.11 and its standard library.
    Minimal,
    /// Minimal plus numpy, pandas and matplotlib (non-interactive `Agg` backend).
    Data,
}

impl Profile {
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "minimal" => Ok(Profile::Minimal),
            "data" => Ok(Profile::Data),
            other => Err(Error::invalid(format!(
                "unknown image profile {other:?}: use `minimal` or `data`"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Minimal => "minimal",
            Profile::Data => "data",
        }
    }

    fn roots(self) -> Vec<&'static str> {
        let mut roots = vec![
            "python3.11-minimal",
            "libpython3.11-stdlib",
            "busybox-static",
        ];
        if self == Profile::Data {
            roots.extend(["python3-numpy", "python3-pandas", "python3-matplotlib"]);
        }
        roots
    }
}

/// Packages never taken into an image although something depends on them: package tools,
/// compilers, headers and GUI toolkits that Python code in a machine does not use.
const NEVER: &[&str] = &[
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

/// Directories removed from the root: documentation, locales, and parts of the standard library
/// that need a display or a compiler.
const PRUNE: &[&str] = &[
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
}

/// A built image.
#[derive(Debug, Clone)]
pub struct Image {
    pub id: String,
    pub profile: Profile,
    /// The root filesystem, never written after the build.
    pub root: PathBuf,
}

/// Where a long build reports how far it is.
pub trait Progress: Send + Sync {
    /// A new stage (`resolving`, `downloading`, ...) with `total` steps (0: unknown).
    fn stage(&self, name: &str, total: usize);
    /// `done` of the stage's steps are finished; `item` is the current one.
    fn step(&self, done: usize, item: &str);
    fn finish(&self, message: &str);
}

/// Progress on stderr: a bar redrawn in place on a terminal, a line per stage otherwise.
#[derive(Debug, Default)]
pub struct StderrProgress {
    state: std::sync::Mutex<(String, usize)>,
}

impl Progress for StderrProgress {
    fn stage(&self, name: &str, total: usize) {
        if let Ok(mut state) = self.state.lock() {
            *state = (name.to_owned(), total);
        }
        let mut err = std::io::stderr().lock();
        if err.is_terminal() {
            let _ = writeln!(err);
        }
        let _ = writeln!(err, "evervm image: {name}");
    }

    fn step(&self, done: usize, item: &str) {
        let mut err = std::io::stderr().lock();
        if !err.is_terminal() {
            return;
        }
        let (name, total) = self.state.lock().map(|s| s.clone()).unwrap_or_default();
        let width = 30;
        let filled = (done * width).checked_div(total).unwrap_or(0);
        let bar: String = "#".repeat(filled) + &"-".repeat(width - filled.min(width));
        let item: String = item.chars().take(40).collect();
        let _ = write!(err, "\r  {name:<12} [{bar}] {done}/{total} {item:<40}");
        let _ = err.flush();
    }

    fn finish(&self, message: &str) {
        let mut err = std::io::stderr().lock();
        if err.is_terminal() {
            let _ = writeln!(err);
        }
        let _ = writeln!(err, "evervm image: {message}");
    }
}

/// Builds images from Debian packages.
#[derive(Debug, Clone)]
pub struct ImageBuilder {
    /// `$EVERVM_HOME/images`.
    images_dir: PathBuf,
    /// Downloaded `.deb` files, shared by every home.
    cache_dir: PathBuf,
}

fn run(command: &mut Command, what: &str) -> Result<String> {
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

fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// `~/.cache/evervm` (or `$XDG_CACHE_HOME/evervm`).
pub fn default_cache_dir() -> PathBuf {
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|c| !c.is_empty()) {
        return PathBuf::from(cache).join("evervm");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/"), PathBuf::from);
    home.join(".cache/evervm")
}

/// Parses `apt-cache depends --recurse` output into each package's dependency groups (each group
/// a list of alternatives, virtual packages replaced by their first provider).
fn parse_depends(text: &str) -> HashMap<String, Vec<Vec<String>>> {
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
fn closure(
    graph: &HashMap<String, Vec<Vec<String>>>,
    roots: &[&str],
    never: &[&str],
) -> BTreeSet<String> {
    let never: BTreeSet<&str> = never.iter().copied().collect();
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
fn parse_show(text: &str) -> Vec<Package> {
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

impl ImageBuilder {
    /// A builder keeping its images in `images_dir` (normally `$EVERVM_HOME/images`).
    pub fn new(images_dir: PathBuf) -> Self {
        Self {
            images_dir,
            cache_dir: default_cache_dir().join("debs"),
        }
    }

    /// The exact packages a profile needs today, as the configured Debian archive has them.
    pub fn resolve(&self, profile: Profile) -> Result<Vec<Package>> {
        let roots = profile.roots();
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
                .args(&roots),
            "resolving the image's packages",
        )?;
        let names = closure(&parse_depends(&depends), &roots, NEVER);
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
    pub fn image_id(profile: Profile, packages: &[Package]) -> String {
        let mut hasher = Sha256::new();
        hasher.update(format!("evervm-image builder={BUILDER_VERSION}\n"));
        hasher.update(format!("profile={}\n", profile.as_str()));
        hasher.update(format!(
            "agent={}\n",
            hex::encode(Sha256::digest(AGENT_SOURCE))
        ));
        for package in packages {
            hasher.update(format!(
                "{} {} {}\n",
                package.name, package.version, package.sha256
            ));
        }
        let digest = hex::encode(hasher.finalize());
        format!("{}-{}", profile.as_str(), &digest[..16])
    }

    /// The image for `profile`, built first if it is not there yet. Builds of one images
    /// directory take turns (a lock file), so concurrent engines build an image once.
    pub fn ensure(&self, profile: Profile, progress: &dyn Progress) -> Result<Image> {
        progress.stage("resolving packages", 0);
        let packages = self.resolve(profile)?;
        let id = Self::image_id(profile, &packages);
        let dir = self.images_dir.join(&id);
        if let Some(image) = Self::load(&dir, &id, profile)? {
            return Ok(image);
        }
        let _turn = self.build_lock()?;
        if let Some(image) = Self::load(&dir, &id, profile)? {
            return Ok(image);
        }
        self.build(profile, &id, &packages, progress)
    }

    /// The newest built image of a profile; if there is none, one built now.
    pub fn built_or_build(&self, profile: Profile, progress: &dyn Progress) -> Result<Image> {
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
        let profile = Profile::parse(id.split('-').next().unwrap_or(""))?;
        Self::load(&self.images_dir.join(id), id, profile)?.ok_or_else(|| {
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
    pub fn find_built(&self, profile: Profile) -> Result<Option<Image>> {
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
            if let Ok(Some(image)) = Self::load(&entry.path(), &name, profile) {
                let manifest = std::fs::read_to_string(entry.path().join("manifest.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<ImageManifest>(&t).ok());
                // An image with another agent still restores the snapshots taken on it, but
                // new sandboxes get this engine's agent.
                let Some(manifest) = manifest.filter(|m| m.agent_sha256 == agent_digest) else {
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

    fn load(dir: &Path, id: &str, profile: Profile) -> Result<Option<Image>> {
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
        if manifest.id != id || manifest.profile != profile || manifest.builder != BUILDER_VERSION {
            return Ok(None);
        }
        Ok(Some(Image {
            id: id.to_owned(),
            profile,
            root: dir.join("rootfs"),
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
        profile: Profile,
        id: &str,
        packages: &[Package],
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
        let result = self.build_in(profile, id, packages, &staging, progress);
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    }

    fn build_in(
        &self,
        profile: Profile,
        id: &str,
        packages: &[Package],
        staging: &Path,
        progress: &dyn Progress,
    ) -> Result<Image> {
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
        configure_root(&root, profile)?;
        progress.stage("checking shared libraries", 0);
        check_libraries(&root)?;
        progress.stage("precompiling the standard library", 0);
        precompile(&root, profile)?;
        smoke_test(&root, profile)?;

        let manifest = ImageManifest {
            format: 1,
            id: id.to_owned(),
            profile,
            builder: BUILDER_VERSION,
            agent_sha256: hex::encode(Sha256::digest(AGENT_SOURCE)),
            packages: packages.to_vec(),
            created_at: chrono::Utc::now().to_rfc3339(),
            root_bytes: tree_size(&root),
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
            profile,
            root: dir.join("rootfs"),
        })
    }
}

fn tree_size(path: &Path) -> u64 {
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

fn symlink(target: &str, link: &Path) -> Result<()> {
    if std::fs::symlink_metadata(link).is_ok() {
        return Ok(());
    }
    if let Some(parent) = link.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::os::unix::fs::symlink(target, link)
        .map_err(|e| Error::internal(format!("cannot link {}: {e}", link.display())))
}

fn write_file(root: &Path, path: &str, contents: &str) -> Result<()> {
    let full = root.join(path.trim_start_matches('/'));
    if let Some(parent) = full.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&full, contents)
        .map_err(|e| Error::internal(format!("cannot write {}: {e}", full.display())))
}

/// Everything `dpkg -x` does not do: links a maintainer script or `update-alternatives` would
/// make, the files of a minimal system, the agent, and pruning.
fn configure_root(root: &Path, profile: Profile) -> Result<()> {
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
    write_file(
        root,
        "/etc/passwd",
        &format!(
            "root:x:0:0:root:/root:/bin/sh\nmachine:x:{MACHINE_UID}:{MACHINE_UID}:evervm machine:\
             {MACHINE_HOME}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
        ),
    )?;
    write_file(
        root,
        "/etc/group",
        &format!("root:x:0:\nmachine:x:{MACHINE_UID}:\nnogroup:x:65534:\n"),
    )?;
    write_file(root, "/etc/hostname", "machine\n")?;
    write_file(
        root,
        "/etc/hosts",
        "127.0.0.1\tlocalhost machine\n::1\tlocalhost\n",
    )?;
    write_file(
        root,
        "/etc/nsswitch.conf",
        "passwd: files\ngroup: files\nhosts: files\n",
    )?;
    if root.join("usr/share/zoneinfo/Etc/UTC").exists() {
        symlink("/usr/share/zoneinfo/Etc/UTC", &root.join("etc/localtime"))?;
    }
    for dir in [
        "tmp",
        "proc",
        "dev",
        "sys",
        "root",
        "home/machine",
        "opt/evervm",
    ] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    std::os::unix::fs::chown(
        root.join("home/machine"),
        Some(MACHINE_UID),
        Some(MACHINE_UID),
    )?;
    write_file(root, AGENT_PATH, AGENT_SOURCE)?;
    if profile == Profile::Data {
        write_file(
            root,
            &format!("{MPLCONFIGDIR}/matplotlibrc"),
            "backend: Agg\n",
        )?;
    }
    Ok(())
}

/// Runs a program inside the image root (chroot; through a user namespace when not root).
fn in_root(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
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

fn precompile(root: &Path, profile: Profile) -> Result<()> {
    let mut dirs = vec!["/usr/lib/python3.11", "/opt/evervm"];
    if profile == Profile::Data {
        dirs.push("/usr/lib/python3/dist-packages");
    }
    let mut args = vec!["/usr/bin/python3.11", "-m", "compileall", "-q", "-j", "1"];
    args.extend(dirs);
    run(&mut in_root(root, &args, &[]), "precompiling Python files")?;
    if profile == Profile::Data {
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
    }
    Ok(())
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

fn collect_objects(root: &Path, dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            collect_objects(root, &path, found);
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
fn check_libraries(root: &Path) -> Result<()> {
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
fn missing_library(line: &str) -> Option<String> {
    if let Some((library, _)) = line.split_once(" => not found") {
        return Some(library.trim().to_owned());
    }
    let rest = line.split_once("error while loading shared libraries: ")?.1;
    Some(rest.split(':').next().unwrap_or(rest).trim().to_owned())
}

fn smoke_test(root: &Path, profile: Profile) -> Result<()> {
    let mut code = String::from(
        "import ssl, sqlite3, ctypes, decimal, json, readline, lzma, bz2, zlib, hashlib, uuid, \
         asyncio, multiprocessing, curses, dbm\n",
    );
    if profile == Profile::Data {
        code.push_str(
            "import numpy, pandas, matplotlib, matplotlib.pyplot as plt\n\
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

#[cfg(test)]
mod tests {
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
        let one = ImageBuilder::image_id(Profile::Minimal, std::slice::from_ref(&package));
        let mut newer = package.clone();
        newer.version = "2.37".into();
        assert_ne!(one, ImageBuilder::image_id(Profile::Minimal, &[newer]));
        assert_ne!(
            one,
            ImageBuilder::image_id(Profile::Data, std::slice::from_ref(&package))
        );
        assert_eq!(one, ImageBuilder::image_id(Profile::Minimal, &[package]));
        assert!(one.starts_with("minimal-"));
    }
}
