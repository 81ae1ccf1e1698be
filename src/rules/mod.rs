//! Rate-limit rules kept in a YAML file, reloaded while the service runs.
//!
//! ```
//! use tollgate::RateLimitLayer;
//! use tollgate::rules::Rules;
//!
//! let rules = Rules::parse(r#"
//! rules:
//!   - name: login
//!     match: { path: /login, methods: [POST] }
//!     key: client_ip
//!     quotas:
//!       - { algorithm: sliding_log, limit: 5, period: 1m }
//!   - name: everything-else
//!     key: peer_ip
//!     quotas:
//!       - { algorithm: gcra, limit: 100, period: 1m, burst: 20 }
//! "#)?;
//! let layer = RateLimitLayer::from_policy(rules);
//! # let _ = layer;
//! # Ok::<(), tollgate::rules::RulesError>(())
//! ```
//!
//! See `examples/rules.yaml` for every setting. Requests are matched against
//! the rules in file order: the first that matches applies (`matching:
//! first`, the default), or every one that matches (`matching: all`), in
//! which case a request refused by a later rule has still spent from the
//! earlier ones (but for what `count_status` rules reserved: that goes
//! back). A request no rule matches is not limited.
//!
//! Rules match the request path in its normal form ([`normalize_path`]), so
//! `//users/1` and `/x/../%75sers/1` meet the rule for `/users/{id}`; a path
//! with no normal form (an encoded `/`, a broken escape) is refused with 400.
//! While the allow or deny list has addresses, a request whose client address
//! cannot be read is refused with 400 too: a list that cannot be checked is
//! never skipped.

mod at;
mod backend;
mod compile;
mod describe;
mod error;
mod host;
mod key_part;
mod model;
mod names;
pub(crate) mod operate;
mod overrides;
mod path;
mod pattern;
mod penalty;
mod period;
mod plan;
mod poll;
mod quotas;
mod response;
pub(crate) mod runtime;
pub(crate) mod top;
mod watch;

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::request::Parts;

pub use backend::{AnyBackend, RedisTarget};
pub use error::RulesError;
pub use host::normalize_host;
pub use path::{PathError, normalize_path};
pub use runtime::POLL_EVERY as OVERRIDES_POLL;
pub use watch::MAX_RULES_FILE_BYTES;

use crate::layer::{Policy, Sealed, Verdict};
use compile::Compiled;
use model::{BackendConfig, RulesFile};

/// Rules from a file, as a [`Policy`] for [`RateLimitLayer`](crate::RateLimitLayer).
///
/// Clones share the rules in force, so a handle kept aside can
/// [`reload`](Rules::reload) them, or [`watch`](Rules::watch) the file.
#[derive(Clone)]
pub struct Rules {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<Compiled>,
    path: Option<PathBuf>,
    /// A backend chosen outside the file (`tollgate serve --redis URL`).
    backend_override: Option<BackendConfig>,
    /// The version in force.
    last: Mutex<Version>,
    /// Whether log lines show client keys as they are (see
    /// [`Rules::log_raw_keys`]); kept here so that every reload keeps it.
    raw_keys_logged: AtomicBool,
}

/// The text in force, and the stamp of the file it was read from.
struct Version {
    text: String,
    stamp: Option<watch::Stamp>,
}

/// Loads a rules file with settings from outside it: made by
/// [`Rules::loader`].
#[derive(Debug, Clone, Default)]
pub struct Loader {
    backend: Option<BackendConfig>,
}

impl Loader {
    /// Replaces the file's backend, whatever it says, with the Redis
    /// `target` names (one server, a cluster or Sentinel's master).
    pub fn redis(mut self, target: &RedisTarget) -> Self {
        self.backend = Some(target.config.clone());
        self
    }

    /// Rules from the file at `path`, under the same checks as
    /// [`Rules::load`].
    pub fn load(self, path: impl AsRef<Path>) -> Result<Rules, RulesError> {
        let path = path.as_ref();
        let (text, stamp) = read(path)?;
        Rules::build(text, Some((path, stamp)), self.backend)
    }
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rules")
            .field("path", &self.inner.path)
            .field("rules", &self.inner.current.load().rules.len())
            .finish_non_exhaustive()
    }
}

impl Rules {
    /// Rules from YAML text.
    pub fn parse(yaml: &str) -> Result<Self, RulesError> {
        Rules::build(yaml.to_owned(), None, None)
    }

    /// Rules from a file. It must be a regular file (not a FIFO, a device
    /// or a directory) of at most [`MAX_RULES_FILE_BYTES`]. For settings
    /// from outside the file (Redis named on a command line), see
    /// [`loader`](Rules::loader).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, RulesError> {
        Rules::loader().load(path)
    }

    /// Loads a file as [`load`](Rules::load) does, with settings from
    /// outside it:
    ///
    /// ```no_run
    /// use tollgate::rules::{RedisTarget, Rules};
    ///
    /// let redis = RedisTarget::url("redis://10.0.0.5:6379").lease("auto");
    /// let rules = Rules::loader().redis(&redis).load("rules.yaml")?;
    /// # Ok::<(), tollgate::rules::RulesError>(())
    /// ```
    pub fn loader() -> Loader {
        Loader::default()
    }

    fn build(
        text: String,
        from: Option<(&Path, watch::Stamp)>,
        backend_override: Option<BackendConfig>,
    ) -> Result<Self, RulesError> {
        let path = from.map(|(path, _)| path);
        let file = parse(&text, path)?;
        let compiled = Compiled::new(file, None, backend_override.as_ref(), path)?;
        crate::metrics::rules_registered();
        Ok(Rules {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(compiled),
                path: path.map(Path::to_path_buf),
                backend_override,
                last: Mutex::new(Version {
                    text,
                    stamp: from.map(|(_, stamp)| stamp),
                }),
                raw_keys_logged: AtomicBool::new(false),
            }),
        })
    }

    /// Writes client keys as they are in this policy's log lines (a backend
    /// failure, a shadow quota's refusal), from now on and after every
    /// reload. By default a line shows a keyed hash of the key instead (the
    /// one [`partition_key`](crate::layer::RateLimitLayerBuilder::partition_key)
    /// sends as `pk`, with the file's `partition_key` secret if it sets one):
    /// keys are often API keys or addresses, which logs should not hold.
    /// Either way the value is quoted, so a key cannot pose as other fields.
    pub fn log_raw_keys(self, raw: bool) -> Self {
        if self.inner.raw_keys_logged.swap(raw, Ordering::Relaxed) == raw {
            return self;
        }
        // The rules in force were compiled with the old setting: compile
        // them again (from the same text, so every quota keeps its
        // counters). That text compiled before, so this fails only if
        // something outside it changed; the new setting then waits for
        // the next reload.
        let last = crate::sync::lock(&self.inner.last);
        let path = self.inner.path.as_deref();
        if let Ok(file) = parse(&last.text, path) {
            if let Ok(compiled) = self.compile(file, path) {
                self.inner.current.store(Arc::new(compiled));
            }
        }
        drop(last);
        self
    }

    /// `key` as this policy's log lines show it (see
    /// [`log_raw_keys`](Rules::log_raw_keys)).
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn logged_key(&self, key: &str) -> String {
        let key = crate::key::Key::from(key.to_owned());
        self.inner.current.load().respond.logged_key(&key)
    }

    /// Compiles `file` over the rules in force, with this handle's settings.
    fn compile(&self, file: RulesFile, path: Option<&Path>) -> Result<Compiled, RulesError> {
        let old = self.inner.current.load_full();
        let mut compiled =
            Compiled::new(file, Some(&old), self.inner.backend_override.as_ref(), path)?;
        compiled.respond.log_raw_keys = self.inner.raw_keys_logged.load(Ordering::Relaxed);
        Ok(compiled)
    }

    /// The rules in force, described in words (what `tollgate check` prints).
    pub fn describe(&self) -> String {
        let current = self.inner.current.load();
        // The backend in force: a command line's Redis replaces the file's.
        let mut file = current.file.clone();
        file.backend = current.backend_config.clone();
        file.to_string()
    }

    /// The backend in force.
    pub fn backend(&self) -> AnyBackend {
        self.inner.current.load().backend.clone()
    }

    /// Reads the file again, at once and with blocking calls (as
    /// [`load`](Rules::load) does, with the same checks). A valid new
    /// version takes effect at once; quotas that did not change keep their
    /// counters (the backend is kept when its settings did not change). An
    /// invalid version changes nothing and is returned as the error.
    /// Returns whether anything changed.
    pub fn reload(&self) -> Result<bool, RulesError> {
        let Some(path) = &self.inner.path else {
            return Ok(false);
        };
        let (text, stamp) = read(path)?;
        self.apply(path, text, Some(stamp))
    }

    /// Puts `text`, read from `path`, in force unless it is the text in
    /// force already; returns whether it changed the rules.
    fn apply(
        &self,
        path: &Path,
        text: String,
        stamp: Option<watch::Stamp>,
    ) -> Result<bool, RulesError> {
        let mut last = crate::sync::lock(&self.inner.last);
        if last.text == text {
            last.stamp = stamp;
            return Ok(false);
        }
        let compiled = parse(&text, Some(path)).and_then(|file| self.compile(file, Some(path)));
        let compiled = match compiled {
            Ok(compiled) => compiled,
            Err(error) => {
                crate::metrics::rules_reloaded("invalid");
                return Err(error);
            }
        };
        self.inner.current.store(Arc::new(compiled));
        *last = Version { text, stamp };
        crate::metrics::rules_reloaded("applied");
        Ok(true)
    }

    /// Checks the file for changes every `every` (from a tokio task) and
    /// reloads it, logging what happened; an invalid version leaves the old
    /// rules in force, and so does a path that is not a regular file or a
    /// file over [`MAX_RULES_FILE_BYTES`]. The file is read only when its
    /// size, modification time or inode changed, and reading and parsing
    /// happen off the runtime's workers (on its blocking threads).
    ///
    /// A new version applies only once it has stayed the same for one
    /// whole `every`: a file rewritten in place is seen half-written
    /// between writes, and a half-written rules file is often valid YAML
    /// with fewer limits. A writer that pauses for longer than `every` can
    /// still be caught midway: write a temporary file in the same
    /// directory and rename it over the rules file, which swaps the whole
    /// file at once. The task ends when every handle to these rules is
    /// gone.
    pub fn watch(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        watch::spawn(self, every)
    }
}

/// Reads a duration written as in rules files (`500ms`, `10s`, `1m30s`); the
/// error says how to write one.
///
/// ```
/// use std::time::Duration;
/// use tollgate::rules::parse_duration;
///
/// assert_eq!(parse_duration("1m30s")?, Duration::from_secs(90));
/// let error = parse_duration("soon").unwrap_err();
/// assert!(error.to_string().contains("soon"));
/// # Ok::<(), tollgate::rules::DurationError>(())
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    period::Period::parse(text).map_err(DurationError)
}

/// A duration [`parse_duration`] could not read; it says how to write one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError(String);

impl std::fmt::Display for DurationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DurationError {}

fn read(path: &Path) -> Result<(String, watch::Stamp), RulesError> {
    watch::read(path).inspect_err(|_| crate::metrics::rules_reloaded("refused"))
}

fn parse(text: &str, path: Option<&Path>) -> Result<RulesFile, RulesError> {
    serde_saphyr::from_str::<RulesFile>(text).map_err(|e| RulesError::new(path, e.to_string()))
}

impl Sealed for Rules {}

impl Policy for Rules {
    fn decide_now(&self, parts: &Parts) -> Option<Verdict> {
        let compiled = self.inner.current.load();
        // Asked first, so that a request bound for `decide` is planned once.
        // A leasing Redis decides now when a lease covers the request.
        if compiled.waits.always() {
            return None;
        }
        let pipeline = compiled.pipeline();
        match compiled.plan(parts) {
            Ok(checks) => pipeline.decide_now(&checks),
            Err(settled) => Some(pipeline.settled(settled)),
        }
    }

    fn decide<'a>(&'a self, parts: &'a Parts) -> impl Future<Output = Verdict> + Send + 'a {
        let compiled = self.inner.current.load_full();
        async move {
            let pipeline = compiled.pipeline();
            match compiled.plan(parts) {
                Ok(checks) => pipeline.decide(checks).await,
                Err(settled) => pipeline.settled(settled),
            }
        }
    }
}
