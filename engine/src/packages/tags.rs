//! Which wheels a machine can use: wheel file names (PEP 427) and their compatibility tags
//! (PEP 425, manylinux PEP 600), ranked the way pip prefers them.

use crate::error::{Error, Result};

/// What a machine runs, as far as wheels care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// CPython's version, major and minor.
    pub python: (u32, u32),
    /// `platform.machine()`: `x86_64`, `aarch64`.
    pub machine: String,
    /// The C library's version (glibc), when known: manylinux wheels need it.
    pub glibc: Option<(u32, u32)>,
}

/// A wheel's file name, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WheelName {
    /// The distribution, as in the file name (normalised with `-` for `_` by the caller).
    pub distribution: String,
    pub version: String,
    /// Every (python, abi, platform) triple the name's compressed tag sets expand to.
    pub tags: Vec<(String, String, String)>,
}

impl WheelName {
    /// `{distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl`.
    pub fn parse(file_name: &str) -> Result<Self> {
        let bad = || Error::invalid(format!("{file_name:?} is not a wheel's file name"));
        let stem = file_name.strip_suffix(".whl").ok_or_else(bad)?;
        let parts: Vec<&str> = stem.split('-').collect();
        let (distribution, version, python, abi, platform) = match parts.as_slice() {
            [d, v, p, a, pl] | [d, v, _, p, a, pl] => (*d, *v, *p, *a, *pl),
            _ => return Err(bad()),
        };
        if [distribution, version, python, abi, platform]
            .iter()
            .any(|part| part.is_empty())
        {
            return Err(bad());
        }
        let mut tags = Vec::new();
        for p in python.split('.') {
            for a in abi.split('.') {
                for pl in platform.split('.') {
                    tags.push((p.to_owned(), a.to_owned(), pl.to_owned()));
                }
            }
        }
        Ok(WheelName {
            distribution: distribution.to_owned(),
            version: version.to_owned(),
            tags,
        })
    }
}

impl Target {
    /// How much the machine prefers a wheel (higher is better), or `None` when it cannot use it.
    pub fn rank(&self, wheel: &WheelName) -> Option<u32> {
        wheel
            .tags
            .iter()
            .filter_map(|(python, abi, platform)| {
                let platform = self.platform_rank(platform)?;
                let interpreter = self.interpreter_rank(python, abi)?;
                Some(interpreter * 1000 + platform)
            })
            .max()
    }

    /// Interpreter and ABI: `cp311-cp311` best, then the stable ABI of this or an older CPython,
    /// then pure Python for this version, for Python 3, or for an older 3.x.
    fn interpreter_rank(&self, python: &str, abi: &str) -> Option<u32> {
        let (major, minor) = self.python;
        let this = format!("cp{major}{minor}");
        let minor_of = |prefix: &str| -> Option<u32> {
            let rest = python.strip_prefix(prefix)?;
            let rest = rest.strip_prefix(&major.to_string())?;
            if rest.is_empty() {
                return Some(u32::MAX);
            }
            rest.parse().ok()
        };
        match abi {
            _ if python == this && abi == this => Some(100),
            "abi3" => {
                let wheel_minor = minor_of("cp")?;
                (wheel_minor != u32::MAX && wheel_minor <= minor).then(|| 50 + wheel_minor)
            }
            "none" => {
                if python == this {
                    return Some(40);
                }
                let wheel_minor = minor_of("py")?;
                if wheel_minor == u32::MAX {
                    Some(20)
                } else {
                    (wheel_minor <= minor).then_some(21 + wheel_minor)
                }
            }
            _ => None,
        }
    }

    /// Platform: a manylinux wheel for a glibc no newer than the machine's (newer policies
    /// first), else `any`.
    fn platform_rank(&self, platform: &str) -> Option<u32> {
        if platform == "any" {
            return Some(1);
        }
        let (glibc_major, glibc_minor) = self.glibc?;
        let arch = &self.machine;
        let (major, minor) = match platform {
            p if p == format!("manylinux1_{arch}") => (2, 5),
            p if p == format!("manylinux2010_{arch}") => (2, 12),
            p if p == format!("manylinux2014_{arch}") => (2, 17),
            p => {
                let rest = p.strip_prefix("manylinux_")?.strip_suffix(arch.as_str())?;
                let rest = rest.strip_suffix('_')?;
                let (major, minor) = rest.split_once('_')?;
                (major.parse().ok()?, minor.parse().ok()?)
            }
        };
        let usable = major == glibc_major && minor <= glibc_minor;
        usable.then(|| 2 + minor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            python: (3, 11),
            machine: "x86_64".into(),
            glibc: Some((2, 36)),
        }
    }

    fn rank(name: &str) -> Option<u32> {
        target().rank(&WheelName::parse(name).unwrap())
    }

    #[test]
    fn names_are_taken_apart() {
        let w = WheelName::parse("requests-2.32.3-py3-none-any.whl").unwrap();
        assert_eq!(w.distribution, "requests");
        assert_eq!(w.version, "2.32.3");
        assert_eq!(w.tags, vec![("py3".into(), "none".into(), "any".into())]);
        let w = WheelName::parse("six-1.16.0-1-py2.py3-none-any.whl").unwrap();
        assert_eq!(w.tags.len(), 2);
        assert!(WheelName::parse("requests-2.32.3.tar.gz").is_err());
        assert!(WheelName::parse("requests-2.32.3-py3-none.whl").is_err());
        assert!(WheelName::parse("a--py3-none-any.whl").is_err());
    }

    #[test]
    fn the_machine_takes_what_it_can_run() {
        assert!(rank("a-1-py3-none-any.whl").is_some());
        assert!(rank("a-1-py2.py3-none-any.whl").is_some());
        assert!(rank("a-1-py2-none-any.whl").is_none());
        assert!(rank("a-1-py312-none-any.whl").is_none());
        assert!(rank("a-1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl").is_some());
        assert!(rank("a-1-cp311-cp311-manylinux_2_38_x86_64.whl").is_none());
        assert!(rank("a-1-cp311-cp311-musllinux_1_1_x86_64.whl").is_none());
        assert!(rank("a-1-cp311-cp311-manylinux_2_17_aarch64.whl").is_none());
        assert!(rank("a-1-cp311-cp311-win_amd64.whl").is_none());
        assert!(rank("a-1-cp312-cp312-manylinux_2_17_x86_64.whl").is_none());
        assert!(rank("a-1-cp310-cp310-manylinux_2_17_x86_64.whl").is_none());
        assert!(rank("a-1-cp38-abi3-manylinux_2_17_x86_64.whl").is_some());
        assert!(rank("a-1-cp312-abi3-manylinux_2_17_x86_64.whl").is_none());
        assert!(rank("a-1-cp311-cp311-linux_x86_64.whl").is_none());
    }

    #[test]
    fn pip_order_is_kept() {
        let order = [
            rank("a-1-cp311-cp311-manylinux_2_28_x86_64.whl"),
            rank("a-1-cp311-cp311-manylinux2014_x86_64.whl"),
            rank("a-1-cp39-abi3-manylinux2014_x86_64.whl"),
            rank("a-1-py3-none-any.whl"),
        ];
        assert!(order.windows(2).all(|w| w[0] > w[1]), "{order:?}");
        let unknown_libc = Target {
            glibc: None,
            ..target()
        };
        let any = WheelName::parse("a-1-py3-none-any.whl").unwrap();
        let native = WheelName::parse("a-1-cp311-cp311-manylinux2014_x86_64.whl").unwrap();
        assert!(unknown_libc.rank(&any).is_some());
        assert!(unknown_libc.rank(&native).is_none());
    }
}
