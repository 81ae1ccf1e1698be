//! The gateway's listener: HTTP/1 connections served with caps and timeouts,
//! so that slow or idle clients hold a bounded amount of memory for a
//! bounded time.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::per_ip::PerIp;

/// What one client may hold, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request's head (request line and headers) must arrive within this,
    /// counted from when the connection is ready for it: a new connection,
    /// or a keep-alive one after its last answer. So it is also how long a
    /// keep-alive connection may sit idle between requests.
    pub header_timeout: Duration,
    /// A connection on which no byte moves either way for this long is
    /// closed: a stalled body upload, a client that stops reading its
    /// answer, an upstream that stops sending its answer's body. While
    /// the gateway itself holds a request (a leaky bucket's delay, waiting
    /// for the upstream's answer to begin) and the client owes no body
    /// bytes, the client is not idle: its connection stays open.
    pub idle_timeout: Duration,
    /// Connections served at once; further ones wait in the kernel's
    /// accept queue until one closes.
    pub max_connections: usize,
    /// Connections one client address (an IPv6 address's /64) may hold at
    /// once; more are closed as soon as they are accepted, so that one
    /// client cannot take every connection and leave the others queued.
    pub max_connections_per_ip: usize,
    /// The longest request head accepted, in bytes (431 beyond): with
    /// `max_connections`, what bounds the memory slow clients hold.
    pub max_header_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_ip: 64,
            max_header_bytes: 32 * 1024,
        }
    }
}

/// hyper will not read into a smaller buffer than this.
const MIN_BUFFER: usize = 8 * 1024;

/// How long a graceful stop waits for open connections before it gives up.
const DRAIN: Duration = Duration::from_secs(30);

/// Whether connections from an address escape the per-address cap: those
/// of a trusted proxy, which carry many clients.
pub type Uncapped = Arc<dyn Fn(IpAddr) -> bool + Send + Sync>;

/// Serves `app` on `listener` until `shutdown` completes, then lets open
/// connections finish their current request (for at most 30 s).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    uncapped: Uncapped,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(MIN_BUFFER));
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let per_ip = PerIp::default();
    let (stop, stopping) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = accept(&listener, &permits) => accepted,
        };
        let Some((permit, stream, peer)) = accepted else {
            continue;
        };
        let counted = if uncapped(peer.ip()) {
            None
        } else {
            match per_ip.admit(peer.ip(), limits.max_connections_per_ip) {
                Some(counted) => Some(counted),
                None => {
                    refuse(stream, peer);
                    continue;
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let hold = Arc::new(Hold::default());
        let io = TokioIo::new(Idle::new(stream, limits.idle_timeout, Arc::clone(&hold)));
        let router = app.clone();
        let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let (mut parts, body) = request.into_parts();
            parts.extensions.insert(ConnectInfo(peer));
            let body = Watched {
                body,
                hold: Arc::clone(&hold),
            };
            let serving = Serving::start(Arc::clone(&hold));
            let answer = router.clone().call(http::Request::from_parts(parts, body));
            async move {
                let answer = answer.await;
                drop(serving);
                answer
            }
        });
        let connection = http.serve_connection(io, service);
        let mut stopping = stopping.clone();
        tokio::spawn(async move {
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = stopping.changed() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "connection closed");
            }
            drop(counted);
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop.send(());
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN:?}; stopping anyway");
    }
}

/// The next connection, once there is room for it. `None` after an accept
/// error (out of file descriptors, a connection reset before it was
/// accepted), after a pause so that such errors cannot spin.
async fn accept(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
) -> Option<(tokio::sync::OwnedSemaphorePermit, TcpStream, SocketAddr)> {
    let permit = Arc::clone(permits).acquire_owned().await.ok()?;
    match listener.accept().await {
        Ok((stream, peer)) => Some((permit, stream, peer)),
        Err(error) => {
            tracing::warn!(%error, "cannot accept a connection");
            tokio::time::sleep(Duration::from_millis(100)).await;
            None
        }
    }
}

/// The answer to a client over its cap, written without waiting (a new
/// connection's send buffer is empty) before it is closed.
const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\n\
connection: close\r\nretry-after: 1\r\ncontent-type: application/problem+json\r\n\
content-length: 96\r\n\r\n\
{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"Too many connections.\"}";

/// Closes a connection from an address over its cap, with a 429 if the
/// socket takes it at once: never a wait, so refusing costs nothing.
fn refuse(stream: TcpStream, peer: SocketAddr) {
    tracing::debug!(%peer, "connection refused: its address holds too many");
    let _ = stream.try_write(TOO_MANY_CONNECTIONS);
}

/// What a connection's current request owes, shared by the stream and the
/// service: while the gateway holds a request the client has sent whole (a
/// leaky bucket's delay, an upstream yet to answer), the client is not
/// idle, and the idle timeout waits.
#[derive(Default)]
struct Hold {
    /// A request is with the service, its answer not yet begun.
    serving: AtomicBool,
    /// The service waits for more of the request body.
    reading: AtomicBool,
    /// The stream's reader, parked without a deadline while the client
    /// owes nothing; woken when it owes again, to start the clock.
    parked: Mutex<Option<Waker>>,
}

impl Hold {
    /// Whether the gateway holds a request and waits for nothing from the
    /// client.
    fn client_owes_nothing(&self) -> bool {
        self.serving.load(Ordering::Acquire) && !self.reading.load(Ordering::Acquire)
    }

    fn set(&self, flag: &AtomicBool, value: bool) {
        let before = flag.swap(value, Ordering::AcqRel);
        if before != value && !self.client_owes_nothing() {
            let parked = self
                .parked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(waker) = parked {
                waker.wake();
            }
        }
    }

    fn park(&self, waker: &Waker) {
        let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        *parked = Some(waker.clone());
    }
}

/// Marks a request as with the service until dropped (answered or
/// abandoned).
struct Serving(Arc<Hold>);

impl Serving {
    fn start(hold: Arc<Hold>) -> Self {
        hold.set(&hold.serving, true);
        Serving(hold)
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.set(&self.0.serving, false);
    }
}

pin_project_lite::pin_project! {
    /// A request body that says when the service waits for more of it.
    struct Watched {
        #[pin]
        body: Incoming,
        hold: Arc<Hold>,
    }
}

impl http_body::Body for Watched {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let poll = this.body.poll_frame(cx);
        this.hold.set(&this.hold.reading, poll.is_pending());
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A stream that fails with `TimedOut` once nothing has moved through it for
/// its timeout while someone waits on it, unless the gateway holds a
/// request the client has sent whole.
struct Idle {
    stream: TcpStream,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    hold: Arc<Hold>,
}

impl Idle {
    fn new(stream: TcpStream, timeout: Duration, hold: Arc<Hold>) -> Self {
        Idle {
            stream,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            hold,
        }
    }

    /// Restarts the clock after progress; when blocked, fails once it runs
    /// out. A read blocked while the client owes nothing parks instead, its
    /// clock restarted when it is woken.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
        reading: bool,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(result) => {
                let deadline = Instant::now() + self.timeout;
                self.deadline.as_mut().reset(deadline);
                Poll::Ready(result)
            }
            Poll::Pending if reading && self.hold.client_owes_nothing() => {
                self.hold.park(cx.waker());
                // Checked again once parked, so a change in between is seen.
                if self.hold.client_owes_nothing() {
                    let deadline = Instant::now() + self.timeout;
                    self.deadline.as_mut().reset(deadline);
                    return Poll::Pending;
                }
                self.check(cx, Poll::Pending, false)
            }
            Poll::Pending => {
                ready!(self.deadline.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the connection was idle too long",
                )))
            }
        }
    }
}

impl AsyncRead for Idle {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.check(cx, poll, true)
    }
}

impl AsyncWrite for Idle {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.check(cx, poll, false)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.check(cx, poll, false)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.check(cx, poll, false)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_says_its_length_right() {
        let text = std::str::from_utf8(TOO_MANY_CONNECTIONS).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length = format!("content-length: {}", body.len());
        assert!(head.split("\r\n").any(|line| line == length), "{head}");
        assert!(head.starts_with("HTTP/1.1 429 "));
    }
}
