//! The gateway's listener: HTTP/1 connections served with caps and timeouts,
//! so that slow or idle clients hold a bounded amount of memory for a
//! bounded time.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
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
    /// answer, an upstream that stops sending its answer's body. Waiting
    /// for the upstream's answer counts too: keep this above the upstream
    /// timeout.
    pub idle_timeout: Duration,
    /// Connections served at once; further ones wait in the kernel's
    /// accept queue until one closes.
    pub max_connections: usize,
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
            max_header_bytes: 32 * 1024,
        }
    }
}

/// hyper will not read into a smaller buffer than this.
const MIN_BUFFER: usize = 8 * 1024;

/// How long a graceful stop waits for open connections before it gives up.
const DRAIN: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown` completes, then lets open
/// connections finish their current request (for at most 30 s).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(MIN_BUFFER));
    let permits = Arc::new(Semaphore::new(limits.max_connections));
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
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(Idle::new(stream, limits.idle_timeout));
        let router = app.clone();
        let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().call(request)
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

/// A stream that fails with `TimedOut` once nothing has moved through it for
/// its timeout while someone waits on it.
struct Idle {
    stream: TcpStream,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Idle {
    fn new(stream: TcpStream, timeout: Duration) -> Self {
        Idle {
            stream,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    /// Restarts the clock after progress; when blocked, fails once it runs out.
    fn check<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(result) => {
                let deadline = Instant::now() + self.timeout;
                self.deadline.as_mut().reset(deadline);
                Poll::Ready(result)
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
        this.check(cx, poll)
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
        this.check(cx, poll)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.check(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.stream).poll_flush(cx);
        this.check(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
