//! The client layer: wait for the provider's turn before calling.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use hashbrown::HashMap;
use http::{Request, Response};
use tokio::sync::Semaphore;
use tower_layer::Layer;
use tower_service::Service;

use super::keys::{ClientKey, MAX_KEY_LEN};
use super::pacer::{Pacer, WaitError};
use super::provider::Signal;
use super::store::PaceStore;
use crate::backend::BackendError;
use crate::sync::lock;

/// Why the layer did not return the provider's answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboundError<E> {
    /// The request's turn would come after more than the longest wait
    /// accepted: it was not sent.
    TooLong {
        /// How long it would have waited.
        would_wait: Duration,
    },
    /// The pacing store failed: the request was not sent (a limit that
    /// cannot be checked is not skipped).
    Store(BackendError),
    /// The key extractor gave no key (or one over
    /// [`MAX_KEY_LEN`](super::MAX_KEY_LEN) bytes): not sent.
    NoKey,
    /// The inner service failed.
    Inner(E),
}

impl<E: fmt::Display> fmt::Display for OutboundError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboundError::TooLong { would_wait } => write!(
                f,
                "not sent: its turn would come in {would_wait:?}, after the longest wait accepted"
            ),
            OutboundError::Store(e) => write!(f, "not sent: the pacing store failed: {e}"),
            OutboundError::NoKey => f.write_str("not sent: the request has no pacing key"),
            OutboundError::Inner(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for OutboundError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OutboundError::Store(e) => Some(e),
            OutboundError::Inner(e) => Some(e),
            _ => None,
        }
    }
}

impl<E> From<WaitError> for OutboundError<E> {
    fn from(e: WaitError) -> Self {
        match e {
            WaitError::TooLong { would_wait } => OutboundError::TooLong { would_wait },
            WaitError::Store(e) => OutboundError::Store(e),
        }
    }
}

/// The last rate announced per key, so that an announcement repeated on
/// every answer reaches the store once.
type Announced = Arc<Mutex<HashMap<Box<str>, u64, foldhash::fast::RandomState>>>;

/// Announcements remembered at most before they are forgotten at once.
const ANNOUNCED_MAX: usize = 1024;

/// A tower layer for clients (a hyper client, a tonic `Channel`, any
/// `Service<http::Request<B>, Response = http::Response<R>>`): each request
/// waits for its key's turn at the pacer's rate, then is sent; the
/// provider's answers pause the key (429 or 503 with `Retry-After`, a
/// `RateLimit` field at `r=0`) and, with [`Adapt`](super::Adapt), cut or
/// set its rate. The provider's answers come back as they are; only a
/// request the layer does not send is an error ([`OutboundError`]).
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use tollgate::Quota;
/// use tollgate::outbound::{DestinationHost, MemoryPace, OutboundLayer, Pacer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pacer = Pacer::new(MemoryPace::new(), &Quota::gcra(5, Duration::from_secs(1)).burst(1).build()?);
/// // Stands for a hyper client or a tonic channel.
/// let provider = tower::service_fn(|_: http::Request<()>| async {
///     Ok::<_, Infallible>(http::Response::new(()))
/// });
/// let client = ServiceBuilder::new()
///     .layer(OutboundLayer::new(pacer, DestinationHost).concurrency(2))
///     .service(provider);
/// let started = tokio::time::Instant::now();
/// for _ in 0..3 {
///     let request = http::Request::get("http://api.example.com/").body(())?;
///     client.clone().oneshot(request).await?;
/// }
/// assert_eq!(started.elapsed(), Duration::from_millis(400));
/// # Ok(())
/// # }
/// ```
pub struct OutboundLayer<S, K> {
    pacer: Pacer<S>,
    key: K,
    concurrency: Option<Arc<Semaphore>>,
    announced: Announced,
}

impl<S: Clone, K: Clone> Clone for OutboundLayer<S, K> {
    fn clone(&self) -> Self {
        OutboundLayer {
            pacer: self.pacer.clone(),
            key: self.key.clone(),
            concurrency: self.concurrency.clone(),
            announced: Arc::clone(&self.announced),
        }
    }
}

impl<S, K> fmt::Debug for OutboundLayer<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboundLayer")
            .field("pacer", &self.pacer)
            .finish_non_exhaustive()
    }
}

impl<S: PaceStore, K> OutboundLayer<S, K> {
    /// Requests paced by `pacer`, each on the key `key` gives it.
    pub fn new(pacer: Pacer<S>, key: K) -> Self {
        OutboundLayer {
            pacer,
            key,
            concurrency: None,
            announced: Arc::default(),
        }
    }

    /// At most `max` requests at once through this layer and its clones
    /// (in this process), each counted from when it asks for its turn until
    /// the answer's head arrives. Requests over it wait, in order, before
    /// asking for their turn (so that none goes late after its turn).
    pub fn concurrency(mut self, max: usize) -> Self {
        self.concurrency = Some(Arc::new(Semaphore::new(max.max(1))));
        self
    }
}

impl<Svc, S: Clone, K: Clone> Layer<Svc> for OutboundLayer<S, K> {
    type Service = Outbound<Svc, S, K>;

    fn layer(&self, inner: Svc) -> Self::Service {
        Outbound {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`OutboundLayer`] makes.
pub struct Outbound<Svc, S, K> {
    inner: Svc,
    layer: OutboundLayer<S, K>,
}

impl<Svc: Clone, S: Clone, K: Clone> Clone for Outbound<Svc, S, K> {
    fn clone(&self) -> Self {
        Outbound {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc, S, K> fmt::Debug for Outbound<Svc, S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbound")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, K, B, R> Service<Request<B>> for Outbound<Svc, S, K>
where
    Svc: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    Svc::Future: Send,
    Svc::Error: Send,
    S: PaceStore,
    K: ClientKey<Request<B>>,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = OutboundError<Svc::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, Self::Error>> + Send>>;

    /// Always ready: a request's wait is its own, in its future, and the
    /// inner service is asked to be ready once its turn has come (asking
    /// before would hold a place in the inner service, a `Buffer`'s say,
    /// for the whole wait).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let key = self
            .layer
            .key
            .key(&request)
            .filter(|k| k.len() <= MAX_KEY_LEN);
        let mut inner = self.inner.clone();
        let layer = self.layer.clone();
        Box::pin(async move {
            let key = key.ok_or(OutboundError::NoKey)?;
            // A place first, then the turn: a request that waited for a
            // place after its turn would go late, among the next turns'.
            let in_flight = match &layer.concurrency {
                // The semaphore is never closed, so acquiring cannot fail.
                Some(s) => Arc::clone(s).acquire_owned().await.ok(),
                None => None,
            };
            let turn = layer.pacer.acquire(&key, 1).await?;
            poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(OutboundError::Inner)?;
            let response = inner.call(request).await.map_err(OutboundError::Inner)?;
            drop(in_flight);
            let signal =
                Signal::from_http(response.status(), response.headers(), SystemTime::now());
            if layer.worth_telling(&key, &signal) {
                // The answer is the provider's either way: a store that
                // cannot take the pause is logged, not made the caller's
                // failure.
                if let Err(error) = layer.pacer.obey(&key, &turn, &signal).await {
                    tracing::warn!(
                        error = error.to_string().as_str(),
                        "could not record the provider's pause"
                    );
                }
            }
            Ok(response)
        })
    }
}

impl<S, K> OutboundLayer<S, K> {
    /// Whether `signal` changes anything the store knows: a pause or a
    /// refusal always; an announced rate when it differs from the last one
    /// this layer saw for `key`.
    fn worth_telling(&self, key: &str, signal: &Signal) -> bool {
        if signal.pause().is_some() || signal.refused() {
            return true;
        }
        let Some(interval) = signal.announced() else {
            return false;
        };
        if !self
            .pacer
            .adaptation()
            .is_some_and(|a| a.follows_announcements())
        {
            return false;
        }
        let mut seen = lock(&self.announced);
        if seen.get(key) == Some(&interval) {
            return false;
        }
        if seen.len() >= ANNOUNCED_MAX {
            seen.clear();
        }
        seen.insert(key.into(), interval);
        true
    }
}

#[cfg(test)]
mod tests;
