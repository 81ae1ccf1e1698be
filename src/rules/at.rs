//! Values that remember where the rules file wrote them, so that a mistake
//! found after parsing (two rules with one name, a cost no quota admits)
//! still points at its line and column.

use serde::Deserialize;
use serde::de::Deserializer;
use serde_saphyr::Spanned;

/// A value and where it was written (line 0 when it was not: a default, or
/// a setting from the command line).
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<T> {
    pub value: T,
    line: u64,
    column: u64,
}

/// A default is written nowhere.
impl<T: Default> Default for At<T> {
    fn default() -> Self {
        At::unplaced(T::default())
    }
}

impl<T> At<T> {
    /// A value written nowhere in the file.
    pub(crate) fn unplaced(value: T) -> Self {
        At {
            value,
            line: 0,
            column: 0,
        }
    }

    /// `message`, prefixed with where the value was written, in the form
    /// the parser's own errors use.
    pub(crate) fn error(&self, message: impl std::fmt::Display) -> String {
        if self.line == 0 {
            message.to_string()
        } else {
            format!("line {} column {}: {message}", self.line, self.column)
        }
    }
}

/// Equal when the values are: moving a setting to another line changes
/// nothing (a reload keeps the backend, and its counters, when only the
/// layout of the file changed).
impl<T: PartialEq> PartialEq for At<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for At<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<T>::deserialize(d)?;
        Ok(At {
            value: spanned.value,
            line: spanned.referenced.line(),
            column: spanned.referenced.column(),
        })
    }
}
