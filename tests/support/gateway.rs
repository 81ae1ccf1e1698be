//! A recording upstream server and `tollgate serve` child processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::response::Response;

use super::process::{TempDir, listen_address};

/// What the upstream received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// An upstream that records every request and answers with its body.
pub async fn upstream() -> Upstream {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let record = Arc::clone(&seen);
    let app = Router::new().fallback(move |req: Request| {
        let record = Arc::clone(&record);
        async move {
            let (parts, body) = req.into_parts();
            let body = to_bytes(body, usize::MAX).await.unwrap().to_vec();
            record.lock().unwrap().push(Seen {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                headers: parts.headers.clone(),
                body: body.clone(),
            });
            Response::builder()
                .status(201)
                .header("x-upstream", "yes")
                .body(Body::from(body))
                .unwrap()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Upstream { addr, seen }
}

/// A loopback port that refuses connections for as long as this lives: a
/// socket bound to it that never listens, so nobody else can take it.
pub struct DeadPort {
    _socket: tokio::net::TcpSocket,
    pub addr: SocketAddr,
}

pub fn dead_port() -> DeadPort {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let addr = socket.local_addr().unwrap();
    DeadPort {
        _socket: socket,
        addr,
    }
}

/// A `tollgate serve` process, stopped on drop.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    /// The addresses the gateway logs as it binds them, after its own
    /// (behind a lock, so a `&Gateway` can be shared between tasks).
    listening: Mutex<std::sync::mpsc::Receiver<Listening>>,
}

/// A listener the gateway logged, with the address the kernel gave it.
enum Listening {
    Serving(SocketAddr),
    Metrics(SocketAddr),
}

impl Gateway {
    pub fn start(config: &Path, upstream: Option<SocketAddr>, extra: &[&str]) -> Gateway {
        Gateway::start_logging_to(config, upstream, extra, None)
    }

    /// Like `start`, with the gateway's log (its stderr) copied to `log`.
    ///
    /// The gateway listens on a port the kernel picks and the address is
    /// read from its "tollgate serving" line: a port found free beforehand
    /// may be taken by another test's server before the gateway binds it,
    /// and a probe would then find that server instead.
    pub fn start_logging_to(
        config: &Path,
        upstream: Option<SocketAddr>,
        extra: &[&str],
        log: Option<std::fs::File>,
    ) -> Gateway {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg("127.0.0.1:0");
        if let Some(up) = upstream {
            cmd.arg("--upstream").arg(format!("http://{up}"));
        }
        // RUST_LOG would override the level that prints the serving line.
        cmd.args(extra)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start tollgate");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the log to its end, so the gateway never blocks on a full pipe.
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            let mut log = log;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = listen_address(&line, "tollgate serving") {
                    let _ = tx.send(Listening::Serving(addr));
                } else if let Some(addr) = listen_address(&line, "metrics at /metrics") {
                    let _ = tx.send(Listening::Metrics(addr));
                }
                if let Some(log) = log.as_mut() {
                    let _ = writeln!(log, "{line}");
                }
            }
        });
        let mut metrics = None;
        let addr = loop {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(Listening::Serving(addr)) => break addr,
                Ok(Listening::Metrics(addr)) => metrics = Some(addr),
                Err(_) => panic!("tollgate did not start listening"),
            }
        };
        let (again, listening) = std::sync::mpsc::channel();
        if let Some(addr) = metrics {
            let _ = again.send(Listening::Metrics(addr));
        }
        // Later lines keep coming on the first channel: pass them on.
        std::thread::spawn(move || {
            for event in rx {
                if again.send(event).is_err() {
                    break;
                }
            }
        });
        Gateway {
            child,
            addr,
            listening: Mutex::new(listening),
        }
    }

    /// Where the gateway serves its metrics (`--metrics-listen`, given
    /// port 0), from its log.
    pub fn metrics_addr(&self) -> SocketAddr {
        let listening = self.listening.lock().unwrap();
        loop {
            match listening.recv_timeout(Duration::from_secs(20)) {
                Ok(Listening::Metrics(addr)) => return addr,
                Ok(Listening::Serving(_)) => {}
                Err(_) => panic!("tollgate did not serve its metrics"),
            }
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A rules file in its own temporary folder (removed on drop). The folder
/// is unique: the tests of one binary run at once in one process.
pub struct RulesFile(pub PathBuf, TempDir);

impl RulesFile {
    pub fn new(name: &str, text: &str) -> Self {
        let dir = TempDir::new(&format!("gw-{name}"));
        let path = dir.0.join("rules.yaml");
        std::fs::write(&path, text).unwrap();
        RulesFile(path, dir)
    }
}
