//! `tollgate`: a rate-limiting reverse proxy configured by a rules file.
//!
//! ```text
//! tollgate serve --config rules.yaml [--listen 127.0.0.1:8080] [--upstream http://127.0.0.1:9000]
//!                [--redis redis://127.0.0.1:6379 | --redis-cluster URL... |
//!                 --redis-sentinel URL... --redis-sentinel-master NAME]
//!                [--redis-ca FILE] [--redis-cert FILE --redis-key FILE]
//!                [--redis-lease auto] [--log-level info] [--log-format json] [--log-raw-keys]
//!                [--metrics-listen 127.0.0.1:9090] [limits...]
//!                [--admin-listen 127.0.0.1:9091 [--admin-token-file tokens]]
//! tollgate check --config rules.yaml
//! ```

#[path = "tollgate/server.rs"]
mod server;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use http::header::{HOST, HeaderName};
use http::{HeaderValue, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate::RateLimitLayer;
use tollgate::backend::BackendErrorKind;
use tollgate::layer::problem_response;
use tollgate::rules::{Rules, normalize_path};

#[path = "tollgate/admin.rs"]
mod admin;
#[path = "tollgate/intermediary.rs"]
mod intermediary;
#[path = "tollgate/metrics.rs"]
mod metrics;
#[path = "tollgate/per_ip.rs"]
mod per_ip;
#[path = "tollgate/rls.rs"]
mod rls;

const USAGE: &str = "\
tollgate: rate-limit any HTTP service with rules kept in a file

usage:
  tollgate serve --config FILE [--listen ADDR] [--upstream URL] [--redis URL] [--redis-lease MODE]
                 [--redis-cluster URL]... [--redis-sentinel URL]... [--redis-sentinel-master NAME]
                 [--redis-ca FILE] [--redis-cert FILE] [--redis-key FILE]
                 [--log-level LEVEL] [--header-timeout T] [--idle-timeout T]
                 [--max-connections N] [--max-connections-per-ip N]
                 [--max-header-bytes N] [--connect-timeout T]
                 [--upstream-timeout T] [--metrics-listen ADDR]
                 [--log-format text|json] [--log-raw-keys]
                 [--admin-listen ADDR] [--admin-token-file FILE]
  tollgate check --config FILE
  tollgate rls --config PATH [--listen ADDR] [--redis URL]...   (see tollgate rls --help)

serve   runs a rate-limiting reverse proxy in front of --upstream (or, without
        one, answers admitted requests itself with a JSON description); the
        rules file is reloaded when it changes
check   validates the rules file and prints the rules as understood

options:
  --config FILE       the rules file (YAML)
  --listen ADDR       where to listen (default 127.0.0.1:8080)
  --upstream URL      the service to forward admitted requests to (http://host:port)
  --redis URL         use Redis at URL as the backend, whatever the file says
                      (redis://[user:password@]host:port, rediss:// for TLS)
  --redis-cluster URL a Redis Cluster node instead; repeat for more nodes
  --redis-sentinel URL
                      a Redis Sentinel instead; repeat for more sentinels;
                      needs --redis-sentinel-master
  --redis-sentinel-master NAME
                      the master's name in the sentinels' configuration
  --redis-ca FILE     trust the CAs in this PEM file for rediss:// (a private CA)
  --redis-cert FILE   with --redis-key: a client certificate (mutual TLS), PEM
  --redis-key FILE    the client certificate's private key, PEM
  --redis-lease MODE  with Redis: lease quota from Redis in batches: off
                      (default), auto, or the most units one lease holds
  --log-level LEVEL   error, warn, info (default), debug or trace; RUST_LOG overrides
  --log-format FORMAT text (default; coloured only on a terminal) or json (one
                      object a line)
  --log-raw-keys      write client keys as they are in log lines (by default
                      a keyed hash of each, as the `pk` parameter sends)
  --metrics-listen ADDR
                      serve Prometheus metrics at http://ADDR/metrics (a listener
                      of its own; off by default)
  --admin-listen ADDR the admin API (inspect and reset keys, overrides, blocks,
                      top offenders; see tollgate::admin) on a listener of its
                      own; off by default. A bare port means 127.0.0.1:PORT; an
                      address other than loopback needs --admin-token-file
  --admin-token-file FILE
                      admin callers' bearer tokens, one `name:token` a line; the
                      name is logged with every change, never the token

limits (durations as in rules files: 500ms, 10s, 1m):
  --header-timeout T     a request's head must arrive within T; also how long a
                         keep-alive connection may wait for its next request (10s)
  --idle-timeout T       close a connection on which nothing moved for T (60s)
  --max-connections N    connections served at once; more wait to be accepted (1024)
  --max-connections-per-ip N
                         connections one client address (IPv6: its /64) may hold;
                         more are answered 429 and closed at once (64)
  --max-header-bytes N   the longest request head, in bytes; 431 beyond (32768)
  --connect-timeout T    connecting to the upstream; 504 beyond (5s)
  --upstream-timeout T   the upstream's answer must begin within T; 504 beyond (30s)
";

struct Args {
    command: String,
    config: PathBuf,
    listen: SocketAddr,
    upstream: Option<Uri>,
    redis: Option<tollgate::rules::RedisTarget>,
    log_level: String,
    log_format: LogFormat,
    log_raw_keys: bool,
    metrics_listen: Option<SocketAddr>,
    admin_listen: Option<SocketAddr>,
    admin_tokens: Option<PathBuf>,
    limits: server::Limits,
    upstream_limits: UpstreamLimits,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

/// How long the upstream may take.
#[derive(Debug, Clone, Copy)]
struct UpstreamLimits {
    connect: Duration,
    response: Duration,
}

impl Default for UpstreamLimits {
    fn default() -> Self {
        UpstreamLimits {
            connect: Duration::from_secs(5),
            response: Duration::from_secs(30),
        }
    }
}

fn duration(flag: &str, text: &str) -> Result<Duration, String> {
    match tollgate::rules::parse_duration(text) {
        Ok(d) if d.is_zero() => Err(format!("{flag} must be above zero")),
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{flag}: {e}")),
    }
}

fn count(flag: &str, text: &str, min: usize, max: usize) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag} {text:?}: give a whole number from {min} to {max}"
        )),
    }
}

/// The `--redis*` flags as given.
#[derive(Default)]
struct RedisFlags {
    url: Option<String>,
    cluster: Vec<String>,
    sentinel: Vec<String>,
    master: Option<String>,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    lease: Option<String>,
}

impl RedisFlags {
    /// The Redis they name, if any; flags that cannot go together refuse.
    fn target(self) -> Result<Option<tollgate::rules::RedisTarget>, String> {
        use tollgate::rules::RedisTarget;
        let places = usize::from(self.url.is_some())
            + usize::from(!self.cluster.is_empty())
            + usize::from(!self.sentinel.is_empty());
        if places > 1 {
            return Err("give only one of --redis, --redis-cluster and --redis-sentinel".into());
        }
        let target = match (self.url, self.sentinel.is_empty(), self.master) {
            (Some(url), _, None) => RedisTarget::url(url),
            (None, true, None) if !self.cluster.is_empty() => RedisTarget::cluster(self.cluster),
            (None, false, Some(master)) => RedisTarget::sentinel(master, self.sentinel),
            (None, false, None) => {
                return Err("--redis-sentinel needs --redis-sentinel-master NAME".into());
            }
            (_, _, Some(_)) => {
                return Err("--redis-sentinel-master needs --redis-sentinel URL".into());
            }
            (None, true, None) => {
                let tls = self.ca.is_some() || self.cert.is_some() || self.key.is_some();
                if self.lease.is_some() || tls {
                    return Err("--redis-lease, --redis-ca, --redis-cert and --redis-key need --redis, --redis-cluster or --redis-sentinel (or set them in the file's backend.redis)".into());
                }
                return Ok(None);
            }
        };
        let mut target = target;
        if let Some(ca) = self.ca {
            target = target.tls_ca_file(ca);
        }
        match (self.cert, self.key) {
            (Some(cert), Some(key)) => target = target.tls_client_cert_files(cert, key),
            (None, None) => {}
            _ => return Err("--redis-cert and --redis-key go together".into()),
        }
        if let Some(lease) = self.lease {
            target = target.lease(lease);
        }
        Ok(Some(target))
    }
}

/// A file named on the command line, made absolute: the rules file's
/// folder is where relative names in the file are read from, not these.
fn absolute(name: String) -> Result<PathBuf, String> {
    std::path::absolute(&name).map_err(|e| format!("{name}: {e}"))
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let command = args.next().ok_or("no command given")?;
    if command == "-h" || command == "--help" || command == "help" {
        return Err(String::new());
    }
    if command != "serve" && command != "check" {
        return Err(format!("unknown command {command:?}"));
    }
    let mut config = None;
    let mut listen: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let (mut upstream, mut log_level) = (None, "info".to_owned());
    let mut redis = RedisFlags::default();
    let mut limits = server::Limits::default();
    let mut upstream_limits = UpstreamLimits::default();
    let mut metrics_listen = None;
    let (mut admin_listen, mut admin_tokens) = (None, None);
    let (mut log_format, mut log_raw_keys) = (LogFormat::Text, false);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(value()?)),
            "--listen" => {
                let v = value()?;
                listen = v
                    .parse()
                    .map_err(|_| format!("--listen {v:?} is not an address like 127.0.0.1:8080"))?;
            }
            "--upstream" => {
                let v = value()?;
                let uri: Uri = v
                    .parse()
                    .map_err(|_| format!("--upstream {v:?} is not a URL"))?;
                if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                    return Err(format!("--upstream {v:?} must be http://host:port"));
                }
                upstream = Some(uri);
            }
            "--redis" => redis.url = Some(value()?),
            "--redis-cluster" => redis.cluster.push(value()?),
            "--redis-sentinel" => redis.sentinel.push(value()?),
            "--redis-sentinel-master" => redis.master = Some(value()?),
            "--redis-ca" => redis.ca = Some(absolute(value()?)?),
            "--redis-cert" => redis.cert = Some(absolute(value()?)?),
            "--redis-key" => redis.key = Some(absolute(value()?)?),
            "--redis-lease" => redis.lease = Some(value()?),
            "--log-level" => log_level = value()?,
            "--log-format" => {
                log_format = match value()?.as_str() {
                    "text" => LogFormat::Text,
                    "json" => LogFormat::Json,
                    other => return Err(format!("--log-format {other:?}: give text or json")),
                };
            }
            "--log-raw-keys" => log_raw_keys = true,
            "--header-timeout" => limits.header_timeout = duration(&flag, &value()?)?,
            "--idle-timeout" => limits.idle_timeout = duration(&flag, &value()?)?,
            "--max-connections" => {
                limits.max_connections = count(&flag, &value()?, 1, 1 << 20)?;
            }
            "--max-connections-per-ip" => {
                limits.max_connections_per_ip = count(&flag, &value()?, 1, 1 << 20)?;
            }
            "--max-header-bytes" => {
                limits.max_header_bytes = count(&flag, &value()?, 1024, 1 << 20)?;
            }
            "--connect-timeout" => upstream_limits.connect = duration(&flag, &value()?)?,
            "--upstream-timeout" => upstream_limits.response = duration(&flag, &value()?)?,
            "--metrics-listen" => {
                let v = value()?;
                let addr = v.parse().map_err(|_| {
                    format!("--metrics-listen {v:?} is not an address like 127.0.0.1:9090")
                })?;
                metrics_listen = Some(addr);
            }
            "--admin-listen" => admin_listen = Some(admin_addr(&value()?)?),
            "--admin-token-file" => admin_tokens = Some(absolute(value()?)?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    let config = config.ok_or("--config FILE is required")?;
    let redis = redis.target()?;
    match (admin_listen, &admin_tokens) {
        (Some(addr), None) if !addr.ip().is_loopback() => {
            return Err(format!(
                "--admin-listen {addr} is not a loopback address: give --admin-token-file too, or listen on 127.0.0.1"
            ));
        }
        (None, Some(_)) => return Err("--admin-token-file needs --admin-listen ADDR".into()),
        _ => {}
    }
    Ok(Args {
        command,
        config,
        listen,
        upstream,
        redis,
        log_level,
        log_format,
        log_raw_keys,
        limits,
        upstream_limits,
        metrics_listen,
        admin_listen,
        admin_tokens,
    })
}

/// `--admin-listen`'s address: `ADDR:PORT`, or a bare port on loopback.
fn admin_addr(v: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = v.parse::<u16>() {
        return Ok(([127, 0, 0, 1], port).into());
    }
    v.parse().map_err(|_| {
        format!("--admin-listen {v:?} is not an address like 127.0.0.1:9091 (or a port)")
    })
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("rls") {
        return rls::main(std::env::args().skip(2));
    }
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) if message.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("tollgate: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    init_logging(&args);

    // Before the rules: their limiters register metrics when built.
    let metrics = match args.metrics_listen.filter(|_| args.command == "serve") {
        Some(addr) => match metrics::install() {
            Ok(handle) => Some((addr, handle)),
            Err(e) => {
                eprintln!("tollgate: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let mut loader = Rules::loader();
    if let Some(target) = &args.redis {
        loader = loader.redis(target);
    }
    let rules = loader.load(&args.config);
    let admin_tokens = match args.admin_tokens.as_deref().map(admin::Tokens::read) {
        Some(Err(e)) => {
            eprintln!("tollgate: {e}");
            return ExitCode::FAILURE;
        }
        Some(Ok(tokens)) => Some(tokens),
        None => None,
    };
    let rules = match rules {
        Ok(rules) => rules.log_raw_keys(args.log_raw_keys),
        Err(error) => {
            eprintln!("tollgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(e) = runtime.block_on(refusal(&rules.backend())) {
        eprintln!("tollgate: {e}");
        return ExitCode::FAILURE;
    }
    let warnings = delay_warnings(&rules, args.limits.idle_timeout);
    if args.command == "check" {
        for warning in &warnings {
            eprintln!("tollgate: warning: {warning}");
        }
        println!("{}: valid\n", args.config.display());
        print!("{}", rules.describe());
        return ExitCode::SUCCESS;
    }
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    match runtime.block_on(serve(args, rules, metrics, admin_tokens)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why `backend` must not be served: a Redis that refuses the scripts would
/// leave every request to the failure policy, so `serve`, `check` and `rls`
/// refuse to start. One that is down may come back (and the backend logs
/// its failures when requests meet them), so that is no reason.
async fn refusal(backend: &tollgate::backend::AnyBackend) -> Option<tollgate::BackendError> {
    backend.probe().await.err().filter(|e| {
        !matches!(
            e.kind(),
            BackendErrorKind::Timeout | BackendErrorKind::Unavailable
        )
    })
}

/// The rules whose leaky bucket may hold a request longer than the idle
/// timeout: the gateway keeps such a connection open, but a client or a
/// proxy in front, with its own timeout, may give up first.
fn delay_warnings(rules: &Rules, idle: Duration) -> Vec<String> {
    (rules.longest_delays().into_iter())
        .filter(|(_, delay)| *delay > idle)
        .map(|(rule, delay)| {
            format!(
                "rule {rule} may hold a request for up to {delay:?} (its leaky bucket's queue), longer than the idle timeout of {idle:?}: the gateway keeps the connection open meanwhile, but clients and proxies in front of it may give up first"
            )
        })
        .collect()
}

/// Log lines to stderr, in the format asked for. Colours only on a
/// terminal (and never under `NO_COLOR`): in a file or a collector, escape
/// codes are noise that hides the text from searches.
fn init_logging(args: &Args) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => builder.with_ansi(false).json().init(),
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            let ansi = std::io::stderr().is_terminal() && !no_color;
            builder.with_ansi(ansi).init();
        }
    }
}

#[derive(Clone)]
struct Upstream {
    base: Uri,
    client: Client<HttpConnector, Body>,
    limits: UpstreamLimits,
}

async fn serve(
    args: Args,
    rules: Rules,
    metrics: Option<(SocketAddr, metrics_exporter_prometheus::PrometheusHandle)>,
    admin_tokens: Option<admin::Tokens>,
) -> std::io::Result<()> {
    if let Some((addr, handle)) = metrics {
        metrics::serve(addr, handle, args.limits).await?;
    }
    let _watcher = rules.watch(Duration::from_millis(250));
    // Other processes' overrides, blocks and resets (on Redis).
    let _overrides = rules.watch_overrides(tollgate::rules::OVERRIDES_POLL);
    if let Some(addr) = args.admin_listen {
        admin::serve(addr, admin_tokens, rules.clone(), args.limits).await?;
    }
    let trusted = rules.clone();
    let uncapped: server::Uncapped = std::sync::Arc::new(move |ip| trusted.is_trusted_proxy(ip));
    let layer = RateLimitLayer::from_policy(rules);
    let app = match args.upstream {
        Some(base) => {
            let limits = args.upstream_limits;
            let mut connector = HttpConnector::new();
            connector.set_connect_timeout(Some(limits.connect));
            connector.set_nodelay(true);
            let client = Client::builder(TokioExecutor::new()).build(connector);
            Router::new()
                .fallback(proxy)
                .with_state(Upstream {
                    base,
                    client,
                    limits,
                })
                .layer(layer)
        }
        None => Router::new().fallback(echo).layer(layer),
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let stop = shutdown();
    tracing::info!(listen = %listener.local_addr()?, limits = ?args.limits, "tollgate serving");
    server::serve(listener, app, args.limits, uncapped, stop).await;
    tracing::info!("tollgate stopped");
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM. The handlers are installed when this is
/// called, not when it is first polled, so that a signal sent as soon as
/// the gateway says it is serving is never missed (and never kills it).
fn shutdown() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let (mut term, mut int) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()).ok(),
            signal(SignalKind::interrupt()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            async fn recv(signal: Option<&mut tokio::signal::unix::Signal>) {
                match signal {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = recv(term.as_mut()) => {}
                () = recv(int.as_mut()) => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
    }
}

/// Without an upstream: say what was decided, for trying rules out.
async fn echo(request: Request) -> Response {
    // A method is a token and a parsed path holds no control characters, so
    // the only JSON escapes needed are for `"` and `\`, which a lenient URI
    // parser may let through; percent-encoding them keeps the path a path.
    let path = request
        .uri()
        .path()
        .replace('"', "%22")
        .replace('\\', "%5C");
    let body = format!(
        "{{\"admitted\":true,\"method\":\"{}\",\"path\":\"{path}\"}}\n",
        request.method()
    );
    ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Hop-by-hop headers, which belong to one connection and are not forwarded.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

async fn proxy(State(up): State<Upstream>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    intermediary::forward_request(&mut parts);
    // Forward the path the rules matched, so that the upstream cannot be
    // reached by a spelling the rules did not see.
    let path = match normalize_path(parts.uri.path()) {
        Ok(path) => path,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("{e}")),
    };
    let path_and_query = match parts.uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.into_owned(),
    };
    let mut target = up.base.clone().into_parts();
    target.path_and_query = match path_and_query.parse() {
        Ok(pq) => Some(pq),
        Err(_) => return bad_gateway("the request path cannot be forwarded"),
    };
    parts.uri = match Uri::from_parts(target) {
        Ok(uri) => uri,
        Err(_) => return bad_gateway("the upstream URL cannot be formed"),
    };
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    if let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>().copied() {
        let xff = HeaderName::from_static("x-forwarded-for");
        let chain = forwarded_for(parts.headers.get_all(&xff), peer.ip());
        parts.headers.insert(xff, chain);
    }
    if !parts.headers.contains_key(HOST) {
        if let Some(host) = up
            .base
            .authority()
            .and_then(|a| HeaderValue::try_from(a.as_str()).ok())
        {
            parts.headers.insert(HOST, host);
        }
    }
    parts.version = http::Version::HTTP_11;
    let upstream_request = http::Request::from_parts(parts, body);
    let answer = tokio::time::timeout(up.limits.response, up.client.request(upstream_request));
    match answer.await {
        Ok(Ok(response)) => {
            let (mut parts, body) = response.into_parts();
            intermediary::strip_connection_fields(&mut parts.headers);
            for name in HOP_BY_HOP {
                parts.headers.remove(name);
            }
            Response::from_parts(parts, Body::new(body))
        }
        Ok(Err(error)) if timed_out(&error) => {
            tracing::warn!(
                error = error.to_string().as_str(),
                "upstream connection timed out"
            );
            gateway_timeout("the upstream service did not accept a connection in time")
        }
        Ok(Err(error)) => {
            tracing::warn!(
                error = error.to_string().as_str(),
                "upstream request failed"
            );
            bad_gateway("the upstream service did not answer")
        }
        Err(_) => {
            tracing::warn!(timeout = ?up.limits.response, "upstream answer timed out");
            gateway_timeout("the upstream service did not answer in time")
        }
    }
}

/// The `X-Forwarded-For` sent upstream: every line's entries, joined in
/// order, then the peer. Bytes are kept as they came (not ASCII included), so
/// the upstream reads the same chain the limiter read.
fn forwarded_for(lines: http::header::GetAll<'_, HeaderValue>, peer: IpAddr) -> HeaderValue {
    let peer = peer.to_string();
    let mut chain = Vec::new();
    for line in lines {
        chain.extend_from_slice(line.as_bytes());
        chain.extend_from_slice(b", ");
    }
    chain.extend_from_slice(peer.as_bytes());
    // Header values never hold the bytes from_bytes refuses, nor does `, ` or an address.
    HeaderValue::from_bytes(&chain).unwrap_or_else(|_| {
        HeaderValue::from_str(&peer).unwrap_or(HeaderValue::from_static("unknown"))
    })
}

/// Whether a client error is a timeout (connecting, with the connect timeout).
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        source = e.source();
    }
    false
}

fn bad_gateway(detail: &str) -> Response {
    problem(StatusCode::BAD_GATEWAY, detail)
}

fn gateway_timeout(detail: &str) -> Response {
    problem(StatusCode::GATEWAY_TIMEOUT, detail)
}

/// An RFC 9457 problem-details answer, as the layer writes its own.
fn problem(status: StatusCode, detail: &str) -> Response {
    problem_response(status, "about:blank", detail).map(Body::from)
}
