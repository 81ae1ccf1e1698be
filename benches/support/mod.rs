//! What the layer benchmarks share: a request from one peer, and a service
//! that answers it at once.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use http::{Request, Response};

pub fn request() -> Request<()> {
    let mut r = Request::new(());
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1234))));
    r
}

/// The future of [`hello`], named so services can be boxed.
pub type Hello = std::future::Ready<Result<Response<String>, Infallible>>;

pub fn hello(_: Request<()>) -> Hello {
    std::future::ready(Ok(Response::new(String::new())))
}
