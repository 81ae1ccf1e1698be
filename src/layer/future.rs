//! The response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::headers::{Headers, apply};
use super::verdict::{Verdict, VerdictKind};
use crate::layer::protect::held::{Held, Settling};

/// A verdict on its way: the policy deciding, then any delay it asks for.
/// Yields the request back with the verdict, so it can be passed on.
type Deciding<ReqBody> = Pin<Box<dyn Future<Output = (Verdict, Request<ReqBody>)> + Send>>;

/// Waits out a passing verdict's delay (a leaky-bucket queue position).
pub(crate) async fn after_delay<B>(verdict: Verdict, request: Request<B>) -> (Verdict, Request<B>) {
    if let VerdictKind::Pass { delay, .. } = &verdict.0 {
        if !delay.is_zero() {
            tokio::time::sleep(delay.get()).await;
        }
    }
    (verdict, request)
}

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the inner
    /// service's future, a response ready at once, or (for backends and keys
    /// that must be awaited, and leaky-bucket delays) a decision under way.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, S::Future, S::Response>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, F, R> {
        Deciding { verdict: Deciding<ReqBody>, inner: Option<S> },
        Inner { #[pin] future: F, headers: Headers, held: Option<Box<Held>> },
        // A response-aware limit's reservation being settled for the
        // response it holds (boxed: inline, it would make every response
        // future larger).
        Settling { settling: Settling, response: Option<Box<R>>, headers: Headers, held: Option<Box<Held>> },
        Ready { response: Option<Box<Response<Bytes>>> },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn inner(future: S::Future, headers: Headers, held: Option<Box<Held>>) -> Self {
        ResponseFuture {
            state: State::Inner {
                future,
                headers,
                held,
            },
        }
    }

    pub(crate) fn respond(response: Box<Response<Bytes>>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn deciding(
        inner: S,
        verdict: impl Future<Output = (Verdict, Request<ReqBody>)> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            state: State::Deciding {
                verdict: Box::pin(verdict),
                inner: Some(inner),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Deciding { verdict, inner } => {
                    let (verdict, request) = ready!(verdict.as_mut().poll(cx));
                    let (headers, held) = match verdict.0 {
                        VerdictKind::Pass { headers, held, .. } => (headers, held),
                        VerdictKind::Respond(response) => return Poll::Ready(Ok(own(*response))),
                    };
                    let Some(mut service) = inner.take() else {
                        return Poll::Ready(Ok(internal_error()));
                    };
                    let future = service.call(request);
                    state.set(State::Inner {
                        future,
                        headers,
                        held,
                    });
                }
                StateProj::Inner {
                    future,
                    headers,
                    held,
                } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(watch) = held.as_mut().and_then(|h| h.usage.as_mut()) {
                        watch.headers(response.headers());
                    }
                    let headers = std::mem::take(headers);
                    let settle = held.as_mut().and_then(|h| h.settle.take());
                    if let Some(settling) = settle.and_then(|s| s(response.status())) {
                        let held = held.take();
                        state.set(State::Settling {
                            settling,
                            response: Some(Box::new(response)),
                            headers,
                            held,
                        });
                        continue;
                    }
                    apply(headers, response.headers_mut());
                    let held = held.take();
                    return Poll::Ready(Ok(response.map(|body| ResponseBody::service(body, held))));
                }
                StateProj::Settling {
                    settling,
                    response,
                    headers,
                    held,
                } => {
                    let settled = ready!(settling.as_mut().poll(cx));
                    let Some(mut response) = response.take().map(|r| *r) else {
                        return Poll::Ready(Ok(internal_error()));
                    };
                    let headers = settled.unwrap_or_else(|| std::mem::take(headers));
                    apply(headers, response.headers_mut());
                    let held = held.take();
                    return Poll::Ready(Ok(response.map(|body| ResponseBody::service(body, held))));
                }
                StateProj::Ready { response } => {
                    return Poll::Ready(Ok(response
                        .take()
                        .map_or_else(internal_error, |r| own(*r))));
                }
            }
        }
    }
}

fn own<B>(response: Response<Bytes>) -> Response<ResponseBody<B>> {
    response.map(ResponseBody::own)
}

/// Only reachable by polling a finished future, which callers must not do;
/// answered rather than panicking on the request path.
fn internal_error<B>() -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::own(Bytes::new()));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}
