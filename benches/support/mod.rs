//! What the layer benchmarks share: a request from one peer, and a service
//! that answers it at once.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};

pub fn request() -> Request<()> {
    let mut r = Request::new(());
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1234))));
    r
}

/// The future of [`hello`], named so services can be boxed.
pub type Hello = std::future::Ready<Result<Response<Body>, Infallible>>;

/// What axum's `"hello"` handler answers: a text body with its
/// `content-type`, so the response's header map is allocated already, as in
/// a real server. (tower_governor needs axum's `Body` for its refusals.)
pub fn hello(_: Request<()>) -> Hello {
    let mut response = Response::new(Body::from("hello"));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    std::future::ready(Ok(response))
}
