//! The response body: the inner service's, or a refusal's.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::layer::protect::held::Held;

pin_project! {
    /// The body of a response from [`RateLimit`](super::RateLimit): the inner
    /// service's body untouched, or the small body of a response the layer
    /// made itself (a 429, 400 or 503). The inner body type is not
    /// constrained beyond carrying [`Bytes`].
    pub struct ResponseBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Service { #[pin] body: B, held: Option<Box<Held>> },
        Own { body: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body, holding `held` until it has been sent or
    /// dropped.
    pub(crate) fn service(body: B, held: Option<Box<Held>>) -> Self {
        ResponseBody {
            inner: Inner::Service { body, held },
        }
    }

    pub(crate) fn own(body: Bytes) -> Self {
        ResponseBody {
            inner: Inner::Own {
                body: (!body.is_empty()).then_some(body),
            },
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().inner.project() {
            InnerProj::Service { mut body, held } => {
                let frame = body.as_mut().poll_frame(cx);
                let usage = held.as_mut().and_then(|h| h.usage.as_mut());
                // The body ended, not failed: the usage is known. A server
                // stops polling at the end it can see (the trailers, the
                // last byte of a known length), so that is the end here too.
                match (&frame, usage) {
                    (Poll::Ready(Some(Ok(f))), Some(watch)) => {
                        if let Some(trailers) = f.trailers_ref() {
                            watch.trailers(trailers);
                            watch.ended();
                        } else if body.is_end_stream() {
                            watch.ended();
                        }
                    }
                    (Poll::Ready(None), Some(watch)) => watch.ended(),
                    _ => {}
                }
                // The body is over (ended or failed): give back what the
                // request held now rather than when the connection drops it.
                if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
                    held.take();
                }
                frame
            }
            InnerProj::Own { body } => Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            // A body watched for its usage is polled to its end, empty or
            // not, so that the end settles the reservation.
            Inner::Service { body, held } => {
                body.is_end_stream() && held.as_ref().is_none_or(|h| h.usage.is_none())
            }
            Inner::Own { body } => body.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Service { body, .. } => body.size_hint(),
            Inner::Own { body } => {
                SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
