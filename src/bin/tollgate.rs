//! `tollgate`: a rate-limiting reverse proxy configured by a rules file.
//!
//! ```text
//! tollgate serve --config rules.yaml [--listen 127.0.0.1:8080] [--upstream http://127.0.0.1:9000]
//!                [--redis redis://127.0.0.1:6379] [--redis-lease auto] [--log-level info]
//!                [--metrics-listen 127.0.0.1:9090] [limits...]
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
use tollgate::layer::problem_response;
use tollgate::rules::{Rules, normalize_path};

#[path = "tollgate/intermediary.rs"]
mod intermediary;
#[path = "tollgate/metrics.rs"]
mod metrics;
#[path = "tollgate/rls.rs"]
mod rls;

const USAGE: &str = "\
tollgate: rate-limit any HTTP service with rules kept in a file

usage:
  tollgate serve --config FILE [--listen ADDR] [--upstream URL] [--redis URL] [--redis-lease MODE]
                 [--log-level LEVEL] [--header-timeout T] [--idle-timeout T]
                 [--max-connections N] [--max-header-bytes N] [--connect-timeout T]
                 [--upstream-timeout T] [--metrics-listen ADDR]
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
  --redis-lease MODE  with --redis: lease quota from Redis in batches: off
                      (default), auto, or the most units one lease holds
  --log-level LEVEL   error, warn, info (default), debug or trace; RUST_LOG overrides
  --metrics-listen ADDR
                      serve Prometheus metrics at http://ADDR/metrics (a listener
                      of its own; off by default)

limits (durations as in rules files: 500ms, 10s, 1m):
  --header-timeout T     a request's head must arrive within T; also how long a
                         keep-alive connection may wait for its next request (10s)
  --idle-timeout T       close a connection on which nothing moved for T (60s)
  --max-connections N    connections served at once; more wait to be accepted (1024)
  --max-header-bytes N   the longest request head, in bytes; 431 beyond (32768)
  --connect-timeout T    connecting to the upstream; 504 beyond (5s)
  --upstream-timeout T   the upstream's answer must begin within T; 504 beyond (30s)
";

struct Args {
    command: String,
    config: PathBuf,
    listen: SocketAddr,
    upstream: Option<Uri>,
    redis: Option<String>,
    redis_lease: Option<String>,
    log_level: String,
    metrics_listen: Option<SocketAddr>,
    limits: server::Limits,
    upstream_limits: UpstreamLimits,
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
    let (mut upstream, mut redis, mut log_level) = (None, None, "info".to_owned());
    let mut redis_lease = None;
    let mut limits = server::Limits::default();
    let mut upstream_limits = UpstreamLimits::default();
    let mut metrics_listen = None;
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
            "--redis" => redis = Some(value()?),
            "--redis-lease" => redis_lease = Some(value()?),
            "--log-level" => log_level = value()?,
            "--header-timeout" => limits.header_timeout = duration(&flag, &value()?)?,
            "--idle-timeout" => limits.idle_timeout = duration(&flag, &value()?)?,
            "--max-connections" => {
                limits.max_connections = count(&flag, &value()?, 1, 1 << 20)?;
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
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    let config = config.ok_or("--config FILE is required")?;
    if redis_lease.is_some() && redis.is_none() {
        return Err(
            "--redis-lease needs --redis URL (or set backend.redis.lease in the file)".into(),
        );
    }
    Ok(Args {
        command,
        config,
        listen,
        upstream,
        redis,
        redis_lease,
        log_level,
        limits,
        upstream_limits,
        metrics_listen,
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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

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
    let rules = match (&args.redis, &args.redis_lease) {
        (Some(url), Some(lease)) => Rules::load_with_redis_lease(&args.config, url, lease),
        (Some(url), None) => Rules::load_with_redis(&args.config, url),
        (None, _) => Rules::load(&args.config),
    };
    let rules = match rules {
        Ok(rules) => rules,
        Err(error) => {
            eprintln!("tollgate: {error}");
            return ExitCode::FAILURE;
        }
    };
    if args.command == "check" {
        println!("{}: valid\n", args.config.display());
        print!("{}", rules.describe());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args, rules, metrics)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
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
) -> std::io::Result<()> {
    if let Some((addr, handle)) = metrics {
        metrics::serve(addr, handle, args.limits).await?;
    }
    let _watcher = rules.watch(Duration::from_millis(250));
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
    tracing::info!(listen = %listener.local_addr()?, limits = ?args.limits, "tollgate serving");
    server::serve(listener, app, args.limits, shutdown()).await;
    tracing::info!("tollgate stopped");
    Ok(())
}

async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutting down");
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
            tracing::warn!(%error, "upstream connection timed out");
            gateway_timeout("the upstream service did not accept a connection in time")
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "upstream request failed");
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
