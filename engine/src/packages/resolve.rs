//! Greedy resolution of requirements to wheels for one machine (see the module above for why
//! greedy and what it refuses).

use std::collections::{BTreeMap, VecDeque};
use std::str::FromStr;

use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{
    MarkerEnvironment, MarkerEnvironmentBuilder, PackageName, Requirement, VersionOrUrl,
};

use super::index::{CachedWheel, IndexFile, PackageIndex};
use super::tags::{Target, WheelName};
use super::wheel::Metadata;
use super::{InstalledPackage, SatisfiedPackage};
use crate::error::{Error, Result};

/// Most packages one install may bring, dependencies included.
const MAX_PACKAGES: usize = 256;

/// What a machine runs and has, as its agent reported it.
pub(crate) struct MachinePython {
    pub target: Target,
    pub markers: MarkerEnvironment,
    pub python_version: Version,
    /// Installed distributions: normalised name to version.
    pub installed: BTreeMap<String, String>,
}

/// The marker values the agent reports (PEP 508's names).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReportedEnvironment {
    pub implementation_name: String,
    pub implementation_version: String,
    pub os_name: String,
    pub platform_machine: String,
    pub platform_python_implementation: String,
    pub platform_release: String,
    pub platform_system: String,
    pub platform_version: String,
    pub python_full_version: String,
    pub python_version: String,
    pub sys_platform: String,
}

impl MachinePython {
    /// Checks what the agent reported. `libc` is `os.confstr("CS_GNU_LIBC_VERSION")`
    /// (`glibc 2.36`).
    pub fn new(
        environment: &ReportedEnvironment,
        libc: Option<&str>,
        installed: BTreeMap<String, String>,
    ) -> Result<Self> {
        let bad = |what: String| Error::crashed(format!("the machine reported {what}"));
        let markers = MarkerEnvironment::try_from(MarkerEnvironmentBuilder {
            implementation_name: &environment.implementation_name,
            implementation_version: &environment.implementation_version,
            os_name: &environment.os_name,
            platform_machine: &environment.platform_machine,
            platform_python_implementation: &environment.platform_python_implementation,
            platform_release: &environment.platform_release,
            platform_system: &environment.platform_system,
            platform_version: &environment.platform_version,
            python_full_version: &environment.python_full_version,
            python_version: &environment.python_version,
            sys_platform: &environment.sys_platform,
        })
        .map_err(|e| bad(format!("an unreadable Python version: {e}")))?;
        if environment.implementation_name != "cpython" {
            return Err(Error::unsupported(format!(
                "installing packages needs CPython, the machine runs {}",
                environment.implementation_name
            )));
        }
        let (major, minor) = environment
            .python_version
            .split_once('.')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| {
                bad(format!(
                    "the Python version {:?}",
                    environment.python_version
                ))
            })?;
        let glibc = libc
            .and_then(|text| text.strip_prefix("glibc "))
            .and_then(|v| v.trim().split_once('.'))
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
        let python_version = Version::from_str(&environment.python_full_version)
            .map_err(|e| bad(format!("the Python version {e}")))?;
        Ok(MachinePython {
            target: Target {
                python: (major, minor),
                machine: environment.platform_machine.clone(),
                glibc,
            },
            markers,
            python_version,
            installed,
        })
    }

    fn describe(&self) -> String {
        let (major, minor) = self.target.python;
        match self.target.glibc {
            Some((a, b)) => format!(
                "CPython {major}.{minor}, glibc {a}.{b}, {}",
                self.target.machine
            ),
            None => format!("CPython {major}.{minor}, {}", self.target.machine),
        }
    }
}

/// A wheel chosen for the machine, in the cache.
pub(crate) struct Planned {
    pub package: InstalledPackage,
    pub wheel: CachedWheel,
}

/// What resolution decided.
pub(crate) struct Plan {
    pub install: Vec<Planned>,
    pub satisfied: Vec<SatisfiedPackage>,
}

struct Wanted {
    requirement: Requirement,
    /// Who asked: `None` for the caller.
    by: Option<String>,
    /// `--hash` pins given by the caller.
    pinned: Vec<String>,
}

/// Parses the caller's requirements: PEP 508 names with versions, extras and markers, each
/// optionally followed by `--hash=sha256:HEX` (as in a requirements file); no URLs or paths.
/// A caller's requirements (an install's, a profile's `wheels`): their number and length
/// checked, then parsed as [`parse_requirements`] does.
pub(crate) fn parse_requested(requirements: &[String]) -> Result<Vec<(Requirement, Vec<String>)>> {
    super::validate_requirements(requirements)?;
    parse_requirements(requirements)
}

pub(crate) fn parse_requirements(
    requirements: &[String],
) -> Result<Vec<(Requirement, Vec<String>)>> {
    requirements
        .iter()
        .map(|text| {
            let mut pinned = Vec::new();
            let mut spec = text.as_str();
            while let Some((before, after)) = spec.rsplit_once("--hash=") {
                let hash = after.trim();
                let hex = hash.strip_prefix("sha256:").ok_or_else(|| {
                    Error::invalid(format!(
                        "{text:?}: only --hash=sha256:HEX pins are supported"
                    ))
                })?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(Error::invalid(format!(
                        "{text:?}: a sha256 pin is 64 hexadecimal digits"
                    )));
                }
                pinned.push(hex.to_ascii_lowercase());
                spec = before.trim_end();
            }
            let requirement = Requirement::from_str(spec).map_err(|e| {
                Error::invalid(format!(
                    "{text:?} is not a requirement like \"requests==2.32.3\": {e}"
                ))
            })?;
            if let Some(VersionOrUrl::Url(_)) = requirement.version_or_url {
                return Err(Error::invalid(format!(
                    "{text:?}: packages come from the package index only, by name and version, \
                     not from a URL"
                )));
            }
            Ok((requirement, pinned))
        })
        .collect()
}

/// Resolves `requirements` for `machine`, downloading (and checking) each chosen wheel.
pub(crate) async fn resolve(
    index: &PackageIndex,
    machine: &MachinePython,
    requirements: Vec<(Requirement, Vec<String>)>,
    max_bytes: u64,
) -> Result<Plan> {
    let mut queue: VecDeque<Wanted> = requirements
        .into_iter()
        .filter(|(r, _)| r.evaluate_markers(&machine.markers, &[]))
        .map(|(requirement, pinned)| Wanted {
            requirement,
            by: None,
            pinned,
        })
        .collect();
    // Chosen so far: normalised name to (version, who chose it, its metadata).
    let mut chosen: BTreeMap<String, (Version, String, Metadata)> = BTreeMap::new();
    let mut satisfied: BTreeMap<String, SatisfiedPackage> = BTreeMap::new();
    let mut install: Vec<Planned> = Vec::new();
    let mut bytes: u64 = 0;
    while let Some(wanted) = queue.pop_front() {
        let name = wanted.requirement.name.to_string();
        let specifiers = match &wanted.requirement.version_or_url {
            Some(VersionOrUrl::VersionSpecifier(s)) => s.clone(),
            _ => VersionSpecifiers::empty(),
        };
        let asker = wanted
            .by
            .clone()
            .unwrap_or_else(|| "the install".to_owned());
        if let Some((version, chooser, metadata)) = chosen.get(&name) {
            if !specifiers.contains(version) {
                return Err(Error::invalid(format!(
                    "conflicting requirements: {asker} needs {}, but {chooser} brought {name} \
                     {version}; pin a version that satisfies both",
                    wanted.requirement
                )));
            }
            // New extras of a chosen package bring their dependencies too.
            let extras = wanted.requirement.extras.clone();
            if !extras.is_empty() {
                let by = format!("{} {}", metadata.name, metadata.version);
                for dependency in dependencies(metadata, machine, &extras)? {
                    queue.push_back(Wanted {
                        requirement: dependency,
                        by: Some(by.clone()),
                        pinned: Vec::new(),
                    });
                }
            }
            continue;
        }
        if satisfied.contains_key(&name) {
            continue;
        }
        if let Some(have) = machine.installed.get(&name)
            && let Ok(version) = Version::from_str(have)
            && specifiers.contains(&version)
            && wanted.pinned.is_empty()
        {
            satisfied.insert(
                name.clone(),
                SatisfiedPackage {
                    name: name.clone(),
                    version: have.clone(),
                },
            );
            continue;
        }
        if chosen.len() >= MAX_PACKAGES {
            return Err(Error::limit_exceeded(format!(
                "one install brings at most {MAX_PACKAGES} packages"
            )));
        }
        let files = index.files(&name).await?;
        let (file, version) = best_file(machine, &name, &specifiers, &files)?;
        let wheel = index
            .wheel(&file, &wanted.pinned, max_bytes.saturating_sub(bytes))
            .await?;
        bytes += wheel.bytes;
        let metadata = {
            let path = wheel.path.clone();
            let filename = file.filename.clone();
            tokio::task::spawn_blocking(move || Metadata::read(&path, &filename))
                .await
                .map_err(|e| Error::internal(format!("reading a wheel: {e}")))??
        };
        let same_name = PackageName::from_str(&metadata.name).is_ok_and(|n| n.to_string() == name);
        if !same_name || Version::from_str(&metadata.version).ok().as_ref() != Some(&version) {
            return Err(Error::invalid(format!(
                "{} says it is {} {}, not {name} {version}",
                file.filename, metadata.name, metadata.version
            )));
        }
        let by = format!("{} {}", metadata.name, metadata.version);
        for dependency in dependencies(&metadata, machine, &wanted.requirement.extras)? {
            queue.push_back(Wanted {
                requirement: dependency,
                by: Some(by.clone()),
                pinned: Vec::new(),
            });
        }
        install.push(Planned {
            package: InstalledPackage {
                name: metadata.name.clone(),
                version: metadata.version.clone(),
                wheel: file.filename.clone(),
                sha256: wheel.sha256.clone(),
                bytes: wheel.bytes,
            },
            wheel,
        });
        chosen.insert(name, (version, asker, metadata));
    }
    Ok(Plan {
        install,
        satisfied: satisfied.into_values().collect(),
    })
}

/// The requirements of a chosen wheel that apply to the machine (and the extras asked for).
fn dependencies(
    metadata: &Metadata,
    machine: &MachinePython,
    extras: &[pep508_rs::ExtraName],
) -> Result<Vec<Requirement>> {
    let mut out = Vec::new();
    for line in &metadata.requires_dist {
        let requirement = Requirement::from_str(line).map_err(|e| {
            Error::invalid(format!(
                "{} {} has a dependency evervm cannot read ({line:?}): {e}",
                metadata.name, metadata.version
            ))
        })?;
        if !requirement.evaluate_markers(&machine.markers, extras) {
            continue;
        }
        if let Some(VersionOrUrl::Url(_)) = requirement.version_or_url {
            return Err(Error::invalid(format!(
                "{} {} depends on a URL ({line:?}), which evervm does not fetch",
                metadata.name, metadata.version
            )));
        }
        out.push(requirement);
    }
    Ok(out)
}

/// The newest version matching `specifiers` with a wheel the machine can use, and its best
/// wheel. Pre-releases only when the specifiers name one, or nothing else matches.
fn best_file(
    machine: &MachinePython,
    name: &str,
    specifiers: &VersionSpecifiers,
    files: &[IndexFile],
) -> Result<(IndexFile, Version)> {
    let wants_pre = specifiers.iter().any(|s| s.version().any_prerelease());
    let python_ok = |file: &IndexFile| {
        file.requires_python.as_deref().is_none_or(|text| {
            VersionSpecifiers::from_str(text).map_or(true, |s| s.contains(&machine.python_version))
        })
    };
    let mut candidates: Vec<(bool, Version, u32, &IndexFile)> = Vec::new();
    let mut any_matching_version = false;
    for file in files.iter().filter(|f| !f.yanked) {
        let is_wheel = std::path::Path::new(&file.filename)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("whl"));
        if !is_wheel {
            let matches =
                sdist_version(&file.filename, name).is_some_and(|v| specifiers.contains(&v));
            any_matching_version |= matches;
            continue;
        }
        let Ok(wheel) = WheelName::parse(&file.filename) else {
            continue;
        };
        let Ok(version) = Version::from_str(&wheel.version) else {
            continue;
        };
        if !specifiers.contains(&version) {
            continue;
        }
        any_matching_version = true;
        let Some(rank) = machine.target.rank(&wheel) else {
            continue;
        };
        if !python_ok(file) {
            continue;
        }
        candidates.push((!version.any_prerelease(), version, rank, file));
    }
    let finals = candidates.iter().any(|(is_final, ..)| *is_final);
    let best = candidates
        .into_iter()
        .filter(|(is_final, ..)| *is_final || wants_pre || !finals)
        .max_by(|a, b| (&a.1, a.2).cmp(&(&b.1, b.2)));
    match best {
        Some((_, version, _, file)) => Ok((file.clone(), version)),
        None if any_matching_version => Err(Error::invalid(format!(
            "{name}{specifiers} has no wheel this machine can use ({}); evervm installs \
             binary wheels only and never builds source distributions (that would run the \
             package's code)",
            machine.describe()
        ))),
        None => Err(Error::invalid(format!(
            "the package index has no version of {name} matching {:?}",
            specifiers.to_string()
        ))),
    }
}

/// The version in a source distribution's name (`name-1.0.tar.gz`), if it is one of `name`'s.
fn sdist_version(filename: &str, name: &str) -> Option<Version> {
    let stem = filename
        .strip_suffix(".tar.gz")
        .or_else(|| filename.strip_suffix(".zip"))?;
    let (project, version) = stem.rsplit_once('-')?;
    let project = PackageName::from_str(project).ok()?;
    (project.to_string() == name).then(|| Version::from_str(version).ok())?
}

#[cfg(test)]
mod tests {
    use super::*;
    use url::Url;

    fn machine() -> MachinePython {
        let environment = ReportedEnvironment {
            implementation_name: "cpython".into(),
            implementation_version: "3.11.2".into(),
            os_name: "posix".into(),
            platform_machine: "x86_64".into(),
            platform_python_implementation: "CPython".into(),
            platform_release: "4.4.0".into(),
            platform_system: "Linux".into(),
            platform_version: "#1 SMP".into(),
            python_full_version: "3.11.2".into(),
            python_version: "3.11".into(),
            sys_platform: "linux".into(),
        };
        let installed = [("numpy".to_owned(), "1.24.2".to_owned())].into();
        MachinePython::new(&environment, Some("glibc 2.36"), installed).unwrap()
    }

    fn file(filename: &str, requires_python: Option<&str>) -> IndexFile {
        IndexFile {
            filename: filename.to_owned(),
            url: Url::parse("https://example.com/x").unwrap(),
            sha256: Some("0".repeat(64)),
            requires_python: requires_python.map(str::to_owned),
            yanked: false,
            size: None,
        }
    }

    fn best(spec: &str, files: &[IndexFile]) -> Result<String> {
        let specifiers = VersionSpecifiers::from_str(spec).unwrap();
        best_file(&machine(), "a", &specifiers, files).map(|(f, _)| f.filename)
    }

    #[test]
    fn requirements_are_parsed_and_urls_refused() {
        let parsed = parse_requirements(&[
            "requests[socks]>=2.31,<3 ; python_version >= '3.8'".into(),
            format!("idna==3.7 --hash=sha256:{}", "AB".repeat(32)),
        ])
        .unwrap();
        assert_eq!(parsed[0].0.name.to_string(), "requests");
        assert_eq!(parsed[1].1, vec!["ab".repeat(32)]);
        for bad in [
            "x @ https://example.com/x.whl",
            "not a requirement!",
            "a --hash=md5:00",
            "a --hash=sha256:00",
            "",
        ] {
            assert!(parse_requirements(&[bad.into()]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_newest_usable_wheel_is_chosen() {
        let files = [
            file("a-1.0-py3-none-any.whl", None),
            file("a-2.0-py3-none-any.whl", None),
            file("a-2.0-cp311-cp311-manylinux2014_x86_64.whl", None),
            file("a-3.0-cp312-cp312-manylinux2014_x86_64.whl", None),
            file("a-3.1-py3-none-any.whl", Some(">=3.12")),
            file("a-4.0b1-py3-none-any.whl", None),
            file("a-5.0.tar.gz", None),
        ];
        assert_eq!(
            best("", &files).unwrap(),
            "a-2.0-cp311-cp311-manylinux2014_x86_64.whl"
        );
        assert_eq!(best("<2", &files).unwrap(), "a-1.0-py3-none-any.whl");
        assert_eq!(best(">=4.0b1", &files).unwrap(), "a-4.0b1-py3-none-any.whl");
        let sdist = best("==5.0", &files).unwrap_err().to_string();
        assert!(sdist.contains("no wheel"), "{sdist}");
        let none = best("==9", &files).unwrap_err().to_string();
        assert!(none.contains("no version"), "{none}");
        let mut yanked = file("a-6.0-py3-none-any.whl", None);
        yanked.yanked = true;
        assert_eq!(
            best("==6.0", &[yanked]).unwrap_err().kind(),
            crate::ErrorKind::InvalidInput
        );
    }
}
