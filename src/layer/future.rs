//! The response future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::headers::{Headers, apply};
use super::policy::VerdictKind;

/// What the asynchronous part of a decision ends in. Always boxed inside the
/// response future, so its size is not worth trading an allocation for.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Gate<ReqBody> {
    Admit {
        request: Request<ReqBody>,
        headers: Headers,
    },
    Respond(Response<Bytes>),
}

impl<ReqBody> Gate<ReqBody> {
    fn new(verdict: VerdictKind, parts: Parts, body: ReqBody) -> Self {
        match verdict {
            VerdictKind::Pass { headers, .. } => Gate::Admit {
                request: Request::from_parts(parts, body),
                headers,
            },
            VerdictKind::Respond(response) => Gate::Respond(response),
        }
    }

    /// Waits out the verdict's delay, if any.
    pub(crate) async fn after(verdict: VerdictKind, parts: Parts, body: ReqBody) -> Self {
        if let VerdictKind::Pass { delay, .. } = &verdict {
            if !delay.is_zero() {
                tokio::time::sleep(*delay).await;
            }
        }
        Gate::new(verdict, parts, body)
    }
}

type GateFuture<ReqBody> = Pin<Box<dyn Future<Output = Gate<ReqBody>> + Send>>;

pin_project! {
    /// The response future of [`RateLimit`](super::RateLimit): the inner
    /// service's future, a response ready at once, or (for backends and keys
    /// that must be awaited, and leaky-bucket delays) a decision under way.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, S::Future>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, F> {
        Deciding { gate: GateFuture<ReqBody>, inner: Option<S> },
        Inner { #[pin] future: F, headers: Headers },
        Ready { response: Option<Response<Bytes>> },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn inner(future: S::Future, headers: Headers) -> Self {
        ResponseFuture {
            state: State::Inner { future, headers },
        }
    }

    pub(crate) fn respond(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    pub(crate) fn gate(
        inner: S,
        gate: impl Future<Output = Gate<ReqBody>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            state: State::Deciding {
                gate: Box::pin(gate),
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
                StateProj::Deciding { gate, inner } => {
                    let (request, headers) = match ready!(gate.as_mut().poll(cx)) {
                        Gate::Admit { request, headers } => (request, headers),
                        Gate::Respond(response) => return Poll::Ready(Ok(own(response))),
                    };
                    let Some(mut service) = inner.take() else {
                        return Poll::Ready(Ok(internal_error()));
                    };
                    let future = service.call(request);
                    state.set(State::Inner { future, headers });
                }
                StateProj::Inner { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    apply(std::mem::take(headers), response.headers_mut());
                    return Poll::Ready(Ok(response.map(ResponseBody::service)));
                }
                StateProj::Ready { response } => {
                    return Poll::Ready(Ok(response.take().map_or_else(internal_error, own)));
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
