//! Reading the rules file, and watching it for new versions.
//!
//! Reading refuses what is not a regular file (opening a FIFO waits for a
//! writer, a device may never end) and anything over
//! [`MAX_RULES_FILE_BYTES`], at the first load as at every reload. Watching
//! does its reading and parsing off the runtime's workers, reads the file
//! only when its size, modification time or identity changed, and applies a
//! version only once it has stayed the same for a whole interval: a file
//! rewritten in place passes through prefixes that may well parse (a list of
//! rules cut after any rule is valid YAML, with fewer limits), and none of
//! them may apply.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;

use super::{Rules, RulesError};
use crate::log_limit::LogLimit;

/// The largest rules file read, in bytes (4 MiB). Rules files are a few
/// kilobytes; a larger one is a mistake or an attack, and reading it at each
/// change would hold a thread and its memory.
pub const MAX_RULES_FILE_BYTES: u64 = 4 << 20;

/// What tells one version of the file from another without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    /// Device and inode: a file renamed over the old one is another file,
    /// whatever its size and time.
    identity: (u64, u64),
}

impl Stamp {
    fn of(meta: &Metadata) -> Self {
        Stamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            identity: identity(meta),
        }
    }
}

#[cfg(unix)]
fn identity(meta: &Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn identity(_: &Metadata) -> (u64, u64) {
    (0, 0)
}

/// The file's stamp, from its metadata alone; refuses what [`read`] would.
pub(super) fn look(path: &Path) -> Result<Stamp, RulesError> {
    let meta = std::fs::metadata(path).map_err(|e| cannot_read(path, &e))?;
    check(path, &meta)?;
    Ok(Stamp::of(&meta))
}

/// The file's text, and the stamp of the version read.
pub(super) fn read(path: &Path) -> Result<(String, Stamp), RulesError> {
    // Looked at before opening: opening a FIFO for reading waits for a
    // writer, on whichever thread opens it.
    look(path)?;
    let file = File::open(path).map_err(|e| cannot_read(path, &e))?;
    // What was opened is checked again: the path may have been replaced
    // between the look and the open.
    let meta = file.metadata().map_err(|e| cannot_read(path, &e))?;
    check(path, &meta)?;
    let mut bytes = Vec::new();
    file.take(MAX_RULES_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| cannot_read(path, &e))?;
    crate::metrics::rules_file_read();
    // It may have grown while read.
    if bytes.len() as u64 > MAX_RULES_FILE_BYTES {
        return Err(too_large(path, bytes.len() as u64));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| RulesError::new(Some(path), "the rules file is not UTF-8 text"))?;
    Ok((text, Stamp::of(&meta)))
}

fn cannot_read(path: &Path, error: &std::io::Error) -> RulesError {
    RulesError::new(Some(path), format!("cannot read the rules file: {error}"))
}

fn too_large(path: &Path, len: u64) -> RulesError {
    RulesError::new(
        Some(path),
        format!(
            "the rules file is {len} bytes, over the {MAX_RULES_FILE_BYTES} accepted; it is not read"
        ),
    )
}

/// Refuses anything but a regular file within the size cap.
fn check(path: &Path, meta: &Metadata) -> Result<(), RulesError> {
    if !meta.is_file() {
        return Err(RulesError::new(
            Some(path),
            format!(
                "the rules file is {}, not a regular file; it is not read",
                kind(meta)
            ),
        ));
    }
    if meta.len() > MAX_RULES_FILE_BYTES {
        return Err(too_large(path, meta.len()));
    }
    Ok(())
}

/// What a path that is not a regular file is, in words.
fn kind(meta: &Metadata) -> &'static str {
    let kind = meta.file_type();
    if kind.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
    }
    "something else"
}

/// The watcher's memory from one tick to the next.
struct Watcher {
    path: PathBuf,
    /// The stamp of the version last read (or in force at the start).
    seen: Option<Stamp>,
    /// A version read at the last tick and not applied yet: it applies if
    /// this tick finds it unchanged.
    pending: Option<String>,
}

/// What one tick found.
enum Step {
    /// Nothing read: the file is as it was.
    Unchanged,
    /// A new version, read and held until the next tick.
    Settling,
    /// A version unchanged for a whole interval was applied (`true` when
    /// it changed the rules).
    Applied(bool),
}

/// Why a tick changed nothing.
enum Failure {
    /// The file could not be read: not a regular file, too large, gone.
    Refused(RulesError),
    /// It was read and is not valid rules.
    Invalid(RulesError),
}

impl Watcher {
    /// One look at the file, with blocking calls.
    fn tick(&mut self, rules: &Rules) -> Result<Step, Failure> {
        let now = look(&self.path).map_err(Failure::Refused)?;
        if self.seen != Some(now) {
            self.pending = None;
            let (text, stamp) = self.read()?;
            self.seen = Some(stamp);
            self.pending = Some(text);
            return Ok(Step::Settling);
        }
        let Some(pending) = self.pending.take() else {
            return Ok(Step::Unchanged);
        };
        // Read again: a write within the clock's granularity keeps the
        // time, and a rewrite of the same length keeps the size.
        let (text, stamp) = self.read()?;
        if stamp != now || text != pending {
            self.seen = Some(stamp);
            self.pending = Some(text);
            return Ok(Step::Settling);
        }
        rules
            .apply(&self.path, text, Some(stamp))
            .map(Step::Applied)
            .map_err(Failure::Invalid)
    }

    /// Reads the file; after a failure the next tick reads it again, so a
    /// version whose read failed is not taken as seen.
    fn read(&mut self) -> Result<(String, Stamp), Failure> {
        read(&self.path).map_err(|error| {
            self.seen = None;
            self.pending = None;
            Failure::Refused(error)
        })
    }
}

/// The task behind [`Rules::watch`].
pub(super) fn spawn(rules: &Rules, every: Duration) -> JoinHandle<()> {
    let weak = Arc::downgrade(&rules.inner);
    let Some(path) = rules.inner.path.clone() else {
        // Rules from text: there is nothing to watch.
        return tokio::spawn(async {});
    };
    let seen = crate::sync::lock(&rules.inner.last).stamp;
    let mut watcher = Watcher {
        path,
        seen,
        pending: None,
    };
    tokio::spawn(async move {
        let errors = LogLimit::new();
        // The first look one interval after the start: the file was just
        // read, and a process starting up has better things to do.
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            let rules = Rules { inner };
            // Reading and parsing block: never on a worker that serves
            // requests (a FIFO in the file's place would hold it for good).
            let blocking = tokio::task::spawn_blocking(move || {
                let step = watcher.tick(&rules);
                (watcher, step)
            });
            let step;
            (watcher, step) = match blocking.await {
                Ok(done) => done,
                // The runtime is shutting down.
                Err(_) => return,
            };
            match step {
                Ok(Step::Applied(true)) => tracing::info!("rules reloaded"),
                Ok(Step::Settling) => {
                    tracing::debug!("rules file changed; it applies once unchanged for {every:?}");
                }
                Ok(Step::Applied(false) | Step::Unchanged) => {}
                Err(failure) => {
                    if let Failure::Refused(_) = failure {
                        crate::metrics::rules_reloaded("refused");
                    }
                    let Some(more) = errors.admit() else { continue };
                    // The error as a string field: the text comes from the
                    // file, quoted so that it cannot pose as other fields.
                    match failure {
                        Failure::Invalid(error) => tracing::error!(
                            error = error.to_string().as_str(),
                            "rules file invalid; keeping the rules in force{more}"
                        ),
                        Failure::Refused(error) => tracing::error!(
                            error = error.to_string().as_str(),
                            "rules file refused; keeping the rules in force{more}"
                        ),
                    }
                }
            }
        }
    })
}
