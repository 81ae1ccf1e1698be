//! A recording upstream server and `tollgate serve` child processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::response::Response;

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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `tollgate serve` process, stopped on drop.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Gateway {
    pub fn start(config: &Path, upstream: Option<SocketAddr>, extra: &[&str]) -> Gateway {
        Gateway::start_logging_to(config, upstream, extra, Stdio::null())
    }

    /// Like `start`, with the gateway's log (its stderr) sent to `log`.
    pub fn start_logging_to(
        config: &Path,
        upstream: Option<SocketAddr>,
        extra: &[&str],
        log: impl Into<Stdio>,
    ) -> Gateway {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(addr.to_string());
        if let Some(up) = upstream {
            cmd.arg("--upstream").arg(format!("http://{up}"));
        }
        cmd.args(extra).stdout(Stdio::null()).stderr(log);
        let child = cmd.spawn().expect("start tollgate");
        let started = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "tollgate did not start listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Gateway { child, addr }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A rules file in its own temporary folder.
pub struct RulesFile(pub PathBuf);

impl RulesFile {
    pub fn new(name: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tollgate-gw-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rules.yaml");
        std::fs::write(&path, text).unwrap();
        RulesFile(path)
    }
}

impl Drop for RulesFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
