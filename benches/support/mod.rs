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

pub async fn hello(_: Request<()>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(String::new()))
}
