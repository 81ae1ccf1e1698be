//! The built-in extractors that read one thing: nothing (one key for all),
//! a header, an extension an auth layer set, the route.

use std::fmt;
use std::marker::PhantomData;

use http::HeaderName;
use http::request::Parts;

use super::{Key, KeyError, KeyExtractor, KeyFuture};

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
/// [`KeyExtractorExt::or`](super::KeyExtractorExt::or) to fall back to the
/// IP); one whose value is not visible ASCII, or that sends the header twice
/// (the service behind may read the other line), has an unreadable one.
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

    /// The key [`route`](Key::route) makes of `text`, `<method> <route>`
    /// as an operator writes it (`get /login` is `route:GET /login`);
    /// `None` without a method that is a token and a route after it.
    #[cfg_attr(not(feature = "rules"), allow(dead_code))]
    pub(crate) fn route_of_text(text: &str) -> Option<Key> {
        let (method, route) = text.split_once(' ')?;
        let method = http::Method::from_bytes(method.as_bytes()).ok()?;
        (!route.is_empty()).then(|| Key::route(&method, route))
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
    use http::StatusCode;

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
