//! Why rules could not be loaded.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why rules could not be loaded: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesError {
    path: Option<PathBuf>,
    message: String,
}

impl RulesError {
    pub(crate) fn new(path: Option<&Path>, message: impl Into<String>) -> Self {
        RulesError {
            path: path.map(Path::to_path_buf),
            message: message.into(),
        }
    }

    /// What is wrong, with the line and column when the file says it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}: {}", p.display(), self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RulesError {}
