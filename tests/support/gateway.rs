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
                if let Some(addr) = serving_address(&line) {
                    let _ = tx.send(addr);
                }
                if let Some(log) = log.as_mut() {
                    let _ = writeln!(log, "{line}");
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("tollgate did not start listening");
        Gateway { child, addr }
    }
}

/// The address in the gateway's "tollgate serving listen=ADDR" line, its
/// colours taken out.
fn serving_address(line: &str) -> Option<SocketAddr> {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // An escape sequence ends with a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    if !plain.contains("tollgate serving") {
        return None;
    }
    let rest = &plain[plain.find("listen=")? + "listen=".len()..];
    rest.split_whitespace().next()?.parse().ok()
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
