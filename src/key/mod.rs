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

mod forwarded;
mod ip;

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use compact_str::CompactString;
use http::request::Parts;
use http::{HeaderName, StatusCode};

pub use forwarded::ForwardedHeader;
#[cfg(feature = "rules")]
pub(crate) use ip::peer_addr;
pub use ip::{ClientIp, Network, NetworkParseError, PeerIp};

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

/// One key for every request: a limit on the service as a whole.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    fn extract(&self, _: &Parts) -> KeyFuture {
        KeyFuture::ready(Ok(Key::from("global")))
    }
}

/// A header's value, such as an API key: `key:<value>`.
///
/// A request without the header has no key (combine with
/// [`KeyExtractorExt::or`] to fall back to the IP); one whose value is not
/// visible ASCII, or that sends the header twice (the service behind may read
/// the other line), has an unreadable one.
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// The value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        let mut lines = parts.headers.get_all(&self.name).iter();
        let result = match lines.next() {
            None => Err(KeyError::Missing("rate-limit key header")),
            // Which line counts is the reader's choice: the limiter reading
            // one and the service another would let `junk` pass for a
            // revoked key.
            Some(_) if lines.next().is_some() => Err(KeyError::Malformed(format!(
                "the {} header (sent more than once)",
                self.name
            ))),
            Some(v) => match v.to_str() {
                Ok(s) if !s.trim().is_empty() => {
                    Ok(Key(compact_str::format_compact!("key:{}", s.trim())))
                }
                Ok(_) => Err(KeyError::Missing("rate-limit key header value")),
                Err(_) => Err(KeyError::Malformed(format!(
                    "the {} header (not visible ASCII)",
                    self.name
                ))),
            },
        };
        KeyFuture::ready(result)
    }
}

/// A value an earlier layer put in the request's extensions, such as the user
/// id an authentication layer identified: `user:<value>`.
///
/// ```
/// use tollgate::key::ExtensionKey;
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl std::fmt::Display for UserId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         self.0.fmt(f)
///     }
/// }
///
/// let by_user = ExtensionKey::<UserId>::new();
/// # let _ = by_user;
/// ```
pub struct ExtensionKey<T> {
    _type: PhantomData<fn() -> T>,
}

impl<T> ExtensionKey<T> {
    /// The extension of type `T`.
    pub fn new() -> Self {
        ExtensionKey { _type: PhantomData }
    }
}

impl<T> Default for ExtensionKey<T> {
    fn default() -> Self {
        ExtensionKey::new()
    }
}

impl<T> Clone for ExtensionKey<T> {
    fn clone(&self) -> Self {
        ExtensionKey::new()
    }
}

impl<T> fmt::Debug for ExtensionKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionKey<{}>", std::any::type_name::<T>())
    }
}

impl<T: fmt::Display + Send + Sync + 'static> KeyExtractor for ExtensionKey<T> {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        KeyFuture::ready(
            parts
                .extensions
                .get::<T>()
                .map(|v| Key(compact_str::format_compact!("user:{v}")))
                .ok_or(KeyError::Missing("user id in the request extensions")),
        )
    }
}

/// The method and route: `route:GET /users/{id}`. Uses the route pattern
/// axum matched (so `/users/1` and `/users/2` share a key); outside an axum
/// router, the request path.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteKey;

impl KeyExtractor for RouteKey {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        let path = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map_or(parts.uri.path(), |m| m.as_str());
        KeyFuture::ready(Ok(Key::route(&parts.method, path)))
    }
}

impl Key {
    /// `route:<method> <route>`: the key of a route, from [`RouteKey`] or
    /// a rule's `route` key part.
    /// The method is upper-cased, and HEAD counts as GET: servers answer
    /// `get` and HEAD with the GET handler, so they are no way around its
    /// limit.
    pub(crate) fn route(method: &http::Method, route: &str) -> Key {
        let method = method.as_str();
        if method == "HEAD" || method.eq_ignore_ascii_case("GET") {
            return Key(compact_str::format_compact!("route:GET {route}"));
        }
        if method.bytes().any(|b| b.is_ascii_lowercase()) {
            let upper = method.to_ascii_uppercase();
            return Key(compact_str::format_compact!("route:{upper} {route}"));
        }
        Key(compact_str::format_compact!("route:{method} {route}"))
    }
}

/// A user id an authentication layer can put in the request extensions, for
/// rules files (`key: user`), which cannot name your own types.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserId(pub String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = http::Request::builder().method(method).uri("/");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_key_header_sent_twice_is_unreadable() {
        let key = HeaderKey::new(HeaderName::from_static("x-api-key"));
        let once = parts("GET", &[("x-api-key", "k1")]);
        assert_eq!(
            key.extract(&once).into_ready().unwrap().unwrap().as_str(),
            "key:k1"
        );
        let twice = parts("GET", &[("x-api-key", "junk"), ("x-api-key", "revoked")]);
        let error = key.extract(&twice).into_ready().unwrap().unwrap_err();
        assert!(matches!(error, KeyError::Malformed(_)), "{error:?}");
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn a_route_key_folds_head_and_method_case_into_get() {
        let get = Key::route(&http::Method::GET, "/login");
        for method in ["HEAD", "get", "Get"] {
            let method = http::Method::from_bytes(method.as_bytes()).unwrap();
            assert_eq!(Key::route(&method, "/login"), get, "{method}");
        }
        let post = http::Method::from_bytes(b"post").unwrap();
        assert_eq!(Key::route(&post, "/login").as_str(), "route:POST /login");
        assert_eq!(
            Key::route(&http::Method::DELETE, "/x").as_str(),
            "route:DELETE /x"
        );
    }
}
