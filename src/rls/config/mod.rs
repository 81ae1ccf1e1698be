//! envoyproxy/ratelimit's configuration: files of `domain` and nested
//! `descriptors`, read unchanged, validated as the reference validates them
//! (with file, line and column), and compiled into one tree per domain.

mod compile;
mod limit;
mod model;
mod tree;
mod unit;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::Spanned;

use crate::quota::Algorithm;
use compile::compile_limit;
pub(crate) use limit::{Limit, LimitKind};
use model::{DescriptorYaml, FileYaml};
pub(crate) use tree::{Domain, Matched};
pub(crate) use unit::Unit;

/// Why the configuration could not be loaded: the file, and what is wrong
/// where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsConfigError {
    message: String,
}

impl RlsConfigError {
    fn new(file: &str, message: impl fmt::Display) -> Self {
        RlsConfigError {
            message: format!("{file}: {message}"),
        }
    }
}

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RlsConfigError {}

/// Every domain's limits, from one file or a directory of files in
/// envoyproxy/ratelimit's format.
///
/// ```
/// use tollgate::rls::RlsConfig;
///
/// let config = RlsConfig::parse("inline.yaml", r#"
/// domain: mongo_cps
/// descriptors:
///   - key: database
///     value: users
///     rate_limit: { unit: second, requests_per_unit: 500 }
/// "#)?;
/// assert_eq!(config.domains(), vec!["mongo_cps"]);
/// # Ok::<(), tollgate::rls::RlsConfigError>(())
/// ```
#[derive(Debug, Default)]
pub struct RlsConfig {
    pub(crate) domains: HashMap<String, Domain>,
    options: LoadOptions,
}

/// How files become an [`RlsConfig`].
///
/// ```
/// use tollgate::rls::{LoadOptions, RlsConfig};
///
/// let a = ("a.yaml".to_owned(), "domain: d\ndescriptors: [{ key: a }]\n".to_owned());
/// let b = ("b.yaml".to_owned(), "domain: d\ndescriptors: [{ key: b }]\n".to_owned());
/// assert!(RlsConfig::parse_files([a.clone(), b.clone()], LoadOptions::default()).is_err());
/// let merging = LoadOptions { merge_domains: true, ..LoadOptions::default() };
/// let config = RlsConfig::parse_files([a, b], merging)?;
/// assert_eq!(config.domains(), vec!["d"]);
/// # Ok::<(), tollgate::rls::RlsConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The algorithm of limits that name none ([`DEFAULT_ALGORITHM`] when
    /// `None`).
    pub algorithm: Option<Algorithm>,
    /// Whether files that name a domain already read add their top-level
    /// descriptors to it, as the reference does with `MERGE_DOMAIN_CONFIG`
    /// set; when false such a file is refused (`duplicate domain`). Either
    /// way a top-level descriptor (key and value) written in two files is
    /// refused: nothing is merged below the top level, and no file's limit
    /// silently replaces another's.
    pub merge_domains: bool,
}

impl LoadOptions {
    /// The reference's environment variable for
    /// [`merge_domains`](LoadOptions::merge_domains).
    pub const MERGE_DOMAIN_CONFIG: &str = "MERGE_DOMAIN_CONFIG";

    /// [`merge_domains`](LoadOptions::merge_domains) as the environment
    /// variable `MERGE_DOMAIN_CONFIG` says: unset is false; set, it must be
    /// a boolean as the reference (Go's `strconv.ParseBool`) reads one
    /// (`1`, `t`, `T`, `TRUE`, `true`, `True`, and their false
    /// counterparts), and anything else is an error rather than a guess.
    pub fn merge_domains_from_env() -> Result<bool, String> {
        let Some(value) = std::env::var_os(Self::MERGE_DOMAIN_CONFIG) else {
            return Ok(false);
        };
        match value.to_str() {
            Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
            Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
            _ => Err(format!(
                "{}={value:?}: give true or false",
                Self::MERGE_DOMAIN_CONFIG
            )),
        }
    }
}

/// The algorithm of a limit that names none: sliding windows, which no
/// window boundary lets twice the limit through.
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingWindow;

/// The names `algorithm:` accepts.
pub(crate) fn parse_algorithm(name: &str) -> Option<Algorithm> {
    Algorithm::ALL.into_iter().find(|a| a.name() == name)
}

impl RlsConfig {
    /// One file's text; `name` is what errors call it.
    pub fn parse(name: &str, text: &str) -> Result<RlsConfig, RlsConfigError> {
        RlsConfig::parse_files([(name.to_owned(), text.to_owned())], LoadOptions::default())
    }

    /// A file, or every `.yaml` and `.yml` file of a directory (not its
    /// subdirectories, nor hidden files), in name order.
    pub fn load(path: impl AsRef<Path>, options: LoadOptions) -> Result<RlsConfig, RlsConfigError> {
        RlsConfig::parse_files(read_all(path.as_ref())?, options)
    }

    /// The domains, sorted.
    pub fn domains(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Files' texts (name, text) in the order they are read, as
    /// [`load`](RlsConfig::load) reads them from disk; names are what
    /// errors call the files.
    pub fn parse_files(
        files: impl IntoIterator<Item = (String, String)>,
        options: LoadOptions,
    ) -> Result<RlsConfig, RlsConfigError> {
        let mut config = RlsConfig {
            domains: HashMap::new(),
            options,
        };
        for (name, text) in files {
            config.add_file(&name, &text)?;
        }
        Ok(config)
    }

    fn add_file(&mut self, file: &str, text: &str) -> Result<(), RlsConfigError> {
        let yaml: FileYaml =
            serde_saphyr::from_str(text).map_err(|e| RlsConfigError::new(file, e))?;
        let domain = match &yaml.domain {
            Some(d) if !d.value.is_empty() => d,
            Some(d) => {
                return Err(RlsConfigError::new(
                    file,
                    at(d, "config file cannot have empty domain"),
                ));
            }
            None => {
                return Err(RlsConfigError::new(
                    file,
                    "config file cannot have empty domain",
                ));
            }
        };
        let algorithm = self.options.algorithm.unwrap_or(DEFAULT_ALGORITHM);
        let merge = self.options.merge_domains;
        // Merging adds this file's top-level descriptors to the domain's,
        // as the reference patches a domain: a descriptor already there is
        // a duplicate, as within one file.
        let root = match self.domains.get_mut(&domain.value) {
            Some(root) if merge => root,
            Some(_) => {
                return Err(RlsConfigError::new(
                    file,
                    at(
                        domain,
                        format!("duplicate domain '{}' in config file", domain.value),
                    ),
                ));
            }
            None => self.domains.entry(domain.value.clone()).or_default(),
        };
        load_level(root, &domain.value, &yaml.descriptors, algorithm)
            .map_err(|e| RlsConfigError::new(file, e))
    }
}

/// `message` prefixed with where `value` was written.
fn at<T>(value: &Spanned<T>, message: impl fmt::Display) -> String {
    format!(
        "line {} column {}: {message}",
        value.referenced.line(),
        value.referenced.column()
    )
}

fn load_level(
    level: &mut Domain,
    parent: &str,
    descriptors: &[Spanned<DescriptorYaml>],
    algorithm: Algorithm,
) -> Result<(), String> {
    for spanned in descriptors {
        let d = &spanned.value;
        let key = match d.key.as_deref() {
            Some(k) if !k.is_empty() => k,
            _ => return Err(at(spanned, "descriptor has empty key")),
        };
        let value = d.value.as_deref().filter(|v| !v.is_empty());
        let mut path = format!("{parent}.{key}");
        if let Some(v) = value {
            path.push('_');
            path.push_str(v);
        }
        if d.share_threshold && !value.is_some_and(|v| v.contains('*')) {
            return Err(at(
                spanned,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{}'",
                    &path[parent.len() + 1..]
                ),
            ));
        }
        let limit = match &d.rate_limit {
            Some(r) => Some(Arc::new(
                compile_limit(r, &path, d, algorithm).map_err(|e| at(r, e))?,
            )),
            None => None,
        };
        let mut child = Domain::node(limit, d.share_threshold);
        load_level(&mut child, &path, &d.descriptors, algorithm)?;
        if !level.insert(key, value, child) {
            return Err(at(
                spanned,
                format!("duplicate descriptor composite key '{path}'"),
            ));
        }
    }
    Ok(())
}

/// The files a path names, with their texts: the file itself, or a
/// directory's YAML files in name order.
pub(crate) fn read_all(path: &Path) -> Result<Vec<(String, String)>, RlsConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| RlsConfigError::new(&shown, e))?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| RlsConfigError::new(&shown, e))? {
            let entry = entry.map_err(|e| RlsConfigError::new(&shown, e))?;
            let p = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
            if yaml && !name.starts_with('.') && p.is_file() {
                files.push(p);
            }
        }
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    files
        .into_iter()
        .map(|p| {
            let shown = p.display().to_string();
            std::fs::read_to_string(&p)
                .map(|text| (shown.clone(), text))
                .map_err(|e| RlsConfigError::new(&shown, e))
        })
        .collect()
}
