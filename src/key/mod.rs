//! Who a request counts against: key extractors.
//!
//! An extractor looks at the request's head ([`Parts`]) and names the client:
//! its IP ([`PeerIp`], or [`ClientIp`] behind trusted proxies), an API key
//! header ([`HeaderKey`]), the user an auth layer identified ([`ExtensionKey`]),
//! the route ([`RouteKey`]), everyone at once ([`GlobalKey`]), or a mix
//! (a tuple of extractors, or [`KeyExtractorExt::or`] for a fallback).
//!
//! Extractors may await (a user id can come from a lookup): they return a
//! [`KeyFuture`], which is ready at once for the built-in ones and costs no
//! allocation then.

mod client_ip;
mod extractors;
mod forwarded;
mod ip;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use compact_str::CompactString;
use http::StatusCode;
use http::request::Parts;

pub use client_ip::{ClientIp, Network, NetworkParseError};
pub use extractors::{ExtensionKey, GlobalKey, HeaderKey, RouteKey, UserId};
pub use forwarded::ForwardedHeader;
pub use ip::PeerIp;
#[cfg(feature = "rules")]
pub(crate) use ip::peer_addr;

/// A client key: the name state is kept under.
///
/// Keys up to 24 bytes (any IPv4 key, `user:` and a 19-digit id) are kept
/// inline, so making one allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(CompactString);

impl Key {
    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Joins parts so that no two different lists give the same key: `|`
    /// separates, and `\` escapes a `|` or `\` inside a part.
    pub fn join<'a>(parts: impl IntoIterator<Item = &'a Key>) -> Key {
        let mut out = CompactString::default();
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            for c in part.0.chars() {
                if c == '|' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
        }
        Key(out)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key(CompactString::from(s))
    }
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key(CompactString::from(s))
    }
}

/// Why no key could be found for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// What the key is made of is not in the request (no such header, no
    /// user id in the extensions).
    Missing(&'static str),
    /// It is there but cannot be read (a malformed `X-Forwarded-For`, a
    /// header value that is not visible ASCII).
    Malformed(String),
    /// The key is longer than the layer accepts.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The most accepted.
        max: usize,
    },
    /// The server did not record the connection's address: serve an axum
    /// router with `into_make_service_with_connect_info::<SocketAddr>()`,
    /// or enable the `tonic` feature for a tonic server.
    NoPeerAddress,
}

impl KeyError {
    /// The status a request gets when its key is refused: 500 when the
    /// server is misconfigured, 400 when the request is at fault.
    pub fn status(&self) -> StatusCode {
        match self {
            KeyError::NoPeerAddress => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Missing(what) => write!(f, "the request has no {what}"),
            KeyError::Malformed(what) => write!(f, "cannot read {what}"),
            KeyError::TooLong { len, max } => {
                write!(
                    f,
                    "the rate-limit key is {len} bytes long, over the {max} accepted"
                )
            }
            KeyError::NoPeerAddress => f.write_str(
                "the connection's address is unknown (axum: serve with \
                 into_make_service_with_connect_info::<SocketAddr>(); tonic: build tollgate \
                 with its `tonic` feature; other servers: insert the peer's SocketAddr in \
                 the request extensions)",
            ),
        }
    }
}

impl std::error::Error for KeyError {}

/// The result of an extraction: ready at once, or a boxed future for
/// extractors that await.
pub struct KeyFuture(KeyFutureInner);

enum KeyFutureInner {
    Ready(Option<Result<Key, KeyError>>),
    Boxed(Pin<Box<dyn Future<Output = Result<Key, KeyError>> + Send>>),
}

impl KeyFuture {
    /// A result known now.
    pub fn ready(result: Result<Key, KeyError>) -> Self {
        KeyFuture(KeyFutureInner::Ready(Some(result)))
    }

    /// A result that must be awaited. The future must own what it needs
    /// (clone it out of the request).
    pub fn new(future: impl Future<Output = Result<Key, KeyError>> + Send + 'static) -> Self {
        KeyFuture(KeyFutureInner::Boxed(Box::pin(future)))
    }

    /// The result, if it is known without waiting.
    pub(crate) fn into_ready(self) -> Result<Result<Key, KeyError>, KeyFuture> {
        match self.0 {
            KeyFutureInner::Ready(Some(result)) => Ok(result),
            inner => Err(KeyFuture(inner)),
        }
    }
}

impl Future for KeyFuture {
    type Output = Result<Key, KeyError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            KeyFutureInner::Ready(result) => Poll::Ready(
                result
                    .take()
                    .unwrap_or(Err(KeyError::Missing("key (polled after completion)"))),
            ),
            KeyFutureInner::Boxed(future) => future.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for KeyFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            KeyFutureInner::Ready(r) => f.debug_tuple("KeyFuture::Ready").field(r).finish(),
            KeyFutureInner::Boxed(_) => f.write_str("KeyFuture::Boxed"),
        }
    }
}

impl From<Result<Key, KeyError>> for KeyFuture {
    fn from(result: Result<Key, KeyError>) -> Self {
        KeyFuture::ready(result)
    }
}

/// Names the client a request counts against.
///
/// Implement it for your own keys; return `KeyFuture::ready(..)` when the
/// answer is at hand, `KeyFuture::new(async move { .. })` when it must be
/// awaited.
///
/// ```
/// use http::request::Parts;
/// use tollgate::key::{Key, KeyError, KeyExtractor, KeyFuture};
///
/// /// The tenant named by the first path segment: `/acme/orders` -> `acme`.
/// #[derive(Clone)]
/// struct Tenant;
///
/// impl KeyExtractor for Tenant {
///     fn extract(&self, parts: &Parts) -> KeyFuture {
///         let tenant = parts.uri.path().split('/').nth(1).filter(|s| !s.is_empty());
///         KeyFuture::ready(
///             tenant
///                 .map(|t| Key::from(format!("tenant:{t}")))
///                 .ok_or(KeyError::Missing("tenant in the path")),
///         )
///     }
/// }
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key of the request whose head is `parts`.
    fn extract(&self, parts: &Parts) -> KeyFuture;
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for Arc<K> {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        (**self).extract(parts)
    }
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for Box<K> {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        (**self).extract(parts)
    }
}

/// Combinators for every extractor.
pub trait KeyExtractorExt: KeyExtractor + Sized {
    /// This key, or `other`'s when this one cannot be found (an API key if
    /// there is one, else the client IP). Any [`KeyError`] falls back:
    /// missing, and malformed too (a header value that is not visible ASCII,
    /// an unreadable forwarding header, a key a custom extractor refuses), so
    /// a client sending a broken API key is limited as its address, never
    /// unlimited. To answer a malformed key 400 instead, use the extractor
    /// alone.
    fn or<O: KeyExtractor>(self, other: O) -> Or<Self, O> {
        Or(self, other)
    }
}

impl<K: KeyExtractor> KeyExtractorExt for K {}

/// See [`KeyExtractorExt::or`].
#[derive(Debug, Clone)]
pub struct Or<A, B>(A, B);

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        match self.0.extract(parts).into_ready() {
            Ok(Ok(key)) => KeyFuture::ready(Ok(key)),
            Ok(Err(_)) => self.1.extract(parts),
            Err(pending) => {
                let fallback = self.1.extract(parts);
                KeyFuture::new(async move {
                    match pending.await {
                        Ok(key) => Ok(key),
                        Err(_) => fallback.await,
                    }
                })
            }
        }
    }
}

macro_rules! tuple_extractor {
    ($($name:ident $var:ident),+) => {
        /// Every part must be found; the key joins them (see [`Key::join`]).
        impl<$($name: KeyExtractor),+> KeyExtractor for ($($name,)+) {
            fn extract(&self, parts: &Parts) -> KeyFuture {
                #[allow(non_snake_case)]
                let ($($name,)+) = self;
                $(let $var = $name.extract(parts);)+
                match ($($var.into_ready(),)+) {
                    ($(Ok($var),)+) => {
                        KeyFuture::ready((|| Ok(Key::join([$(&$var?),+])))())
                    }
                    ($($var,)+) => {
                        $(let $var = $var.map_or_else(|pending| pending, KeyFuture::ready);)+
                        KeyFuture::new(async move { Ok(Key::join([$(&$var.await?),+])) })
                    }
                }
            }
        }
    };
}

tuple_extractor!(A a, B b);
tuple_extractor!(A a, B b, C c);
tuple_extractor!(A a, B b, C c, D d);
