//! Which key a client request waits on.

use std::sync::Arc;

use http::{HeaderName, Request};

/// Keys longer than this are refused: a key is stored (in Redis, a key's
/// name), and a header may be as long as its sender likes.
pub const MAX_KEY_LEN: usize = 512;

/// Gives the key a request to the provider waits its turn on; `None`
/// (or a key over [`MAX_KEY_LEN`] bytes) refuses the request with
/// [`OutboundError::NoKey`](super::OutboundError::NoKey).
///
/// Implemented by [`DestinationHost`], [`RequestHeader`], [`OneKey`], and
/// closures `Fn(&Request) -> Option<String>`.
pub trait ClientKey<Req>: Clone + Send + Sync + 'static {
    /// The key of `request`.
    fn key(&self, request: &Req) -> Option<String>;
}

impl<Req, F> ClientKey<Req> for F
where
    F: Fn(&Req) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn key(&self, request: &Req) -> Option<String> {
        self(request)
    }
}

/// The host (and port, if given) the request goes to: its URI's
/// authority, or its `Host` header when the URI has none (a request built
/// for a connection already open). One schedule per provider host: a
/// crawler's politeness, a per-host API limit. Lowercased, so that
/// `API.example.com` and `api.example.com` wait together.
#[derive(Debug, Clone, Copy, Default)]
pub struct DestinationHost;

impl<B> ClientKey<Request<B>> for DestinationHost {
    fn key(&self, request: &Request<B>) -> Option<String> {
        let host = match request.uri().authority() {
            Some(authority) => authority.as_str().rsplit('@').next()?.to_owned(),
            None => request
                .headers()
                .get(http::header::HOST)?
                .to_str()
                .ok()?
                .trim()
                .to_owned(),
        };
        (!host.is_empty()).then(|| host.to_ascii_lowercase())
    }
}

/// The value of a request header (a tenant, an API key's id), as it is.
/// A request without it, or with a value that is not visible ASCII, has
/// no key.
#[derive(Debug, Clone)]
pub struct RequestHeader(pub HeaderName);

impl<B> ClientKey<Request<B>> for RequestHeader {
    fn key(&self, request: &Request<B>) -> Option<String> {
        let value = request.headers().get(&self.0)?.to_str().ok()?;
        (!value.is_empty()).then(|| value.to_owned())
    }
}

/// One key for every request: one provider behind one limit.
#[derive(Debug, Clone)]
pub struct OneKey(pub Arc<str>);

impl OneKey {
    /// Every request waits on `key`.
    pub fn new(key: &str) -> Self {
        OneKey(key.into())
    }
}

impl<Req> ClientKey<Req> for OneKey {
    fn key(&self, _: &Req) -> Option<String> {
        Some(self.0.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_host_from_the_uri_or_the_host_header() {
        let req = Request::get("http://User:pw@API.Example.com:8443/x")
            .body(())
            .unwrap();
        assert_eq!(
            DestinationHost.key(&req).as_deref(),
            Some("api.example.com:8443")
        );
        let req = Request::get("/x")
            .header("host", "svc.local")
            .body(())
            .unwrap();
        assert_eq!(DestinationHost.key(&req).as_deref(), Some("svc.local"));
        let req = Request::get("/x").body(()).unwrap();
        assert_eq!(DestinationHost.key(&req), None);
    }

    #[test]
    fn header_and_closure_keys() {
        let req = Request::get("/").header("x-tenant", "t1").body(()).unwrap();
        let by_header = RequestHeader(HeaderName::from_static("x-tenant"));
        assert_eq!(by_header.key(&req).as_deref(), Some("t1"));
        let by_path = |r: &Request<()>| Some(r.uri().path().to_owned());
        assert_eq!(by_path.key(&req).as_deref(), Some("/"));
    }
}
