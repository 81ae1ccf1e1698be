//! `tollgate`: a rate-limiting reverse proxy configured by a rules file.
//!
//! ```text
//! tollgate serve --config rules.yaml [--listen 127.0.0.1:8080] [--upstream http://127.0.0.1:9000]
//!                [--redis redis://127.0.0.1:6379] [--log-level info]
//!                [--metrics-listen 127.0.0.1:9090]
//! tollgate check --config rules.yaml
//! ```

use std::net::SocketAddr;
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
use tollgate::rules::Rules;

#[path = "tollgate/intermediary.rs"]
mod intermediary;
#[path = "tollgate/metrics.rs"]
mod metrics;

const USAGE: &str = "\
tollgate: rate-limit any HTTP service with rules kept in a file

usage:
  tollgate serve --config FILE [--listen ADDR] [--upstream URL] [--redis URL] [--log-level LEVEL]
                 [--metrics-listen ADDR]
  tollgate check --config FILE

serve   runs a rate-limiting reverse proxy in front of --upstream (or, without
        one, answers admitted requests itself with a JSON description); the
        rules file is reloaded when it changes
check   validates the rules file and prints the rules as understood

options:
  --config FILE       the rules file (YAML)
  --listen ADDR       where to listen (default 127.0.0.1:8080)
  --upstream URL      the service to forward admitted requests to (http://host:port)
  --redis URL         use Redis at URL as the backend, whatever the file says
  --log-level LEVEL   error, warn, info (default), debug or trace; RUST_LOG overrides
  --metrics-listen ADDR
                      serve Prometheus metrics at http://ADDR/metrics (a listener
                      of its own; off by default)
";

struct Args {
    command: String,
    config: PathBuf,
    listen: SocketAddr,
    upstream: Option<Uri>,
    redis: Option<String>,
    log_level: String,
    metrics_listen: Option<SocketAddr>,
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
            "--log-level" => log_level = value()?,
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
    Ok(Args {
        command,
        config,
        listen,
        upstream,
        redis,
        log_level,
        metrics_listen,
    })
}

fn main() -> ExitCode {
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
    let rules = match &args.redis {
        Some(url) => Rules::load_with_redis(&args.config, url),
        None => Rules::load(&args.config),
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
}

async fn serve(
    args: Args,
    rules: Rules,
    metrics: Option<(SocketAddr, metrics_exporter_prometheus::PrometheusHandle)>,
) -> std::io::Result<()> {
    if let Some((addr, handle)) = metrics {
        metrics::serve(addr, handle).await?;
    }
    let _watcher = rules.watch(Duration::from_millis(250));
    let layer = RateLimitLayer::from_policy(rules);
    let app = match args.upstream {
        Some(base) => {
            let client = Client::builder(TokioExecutor::new()).build_http();
            Router::new()
                .fallback(proxy)
                .with_state(Upstream { base, client })
                .layer(layer)
        }
        None => Router::new().fallback(echo).layer(layer),
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(listen = %listener.local_addr()?, "tollgate serving");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown())
    .await?;
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
    let mut body = String::from("{\"admitted\":true,\"method\":");
    push_json(&mut body, request.method().as_str());
    body.push_str(",\"path\":");
    push_json(&mut body, request.uri().path());
    body.push('}');
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        body + "\n",
    )
        .into_response()
}

fn push_json(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
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
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
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
        let chain = match parts.headers.get(&xff).and_then(|v| v.to_str().ok()) {
            Some(prior) => format!("{prior}, {}", peer.ip()),
            None => peer.ip().to_string(),
        };
        if let Ok(v) = HeaderValue::try_from(chain) {
            parts.headers.insert(xff, v);
        }
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
    match up.client.request(upstream_request).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            intermediary::strip_connection_fields(&mut parts.headers);
            for name in HOP_BY_HOP {
                parts.headers.remove(name);
            }
            Response::from_parts(parts, Body::new(body))
        }
        Err(error) => {
            tracing::warn!(%error, "upstream request failed");
            bad_gateway("the upstream service did not answer")
        }
    }
}

fn bad_gateway(detail: &str) -> Response {
    let mut body = String::from(
        "{\"type\":\"about:blank\",\"title\":\"Bad Gateway\",\"status\":502,\"detail\":",
    );
    push_json(&mut body, detail);
    body.push('}');
    (
        StatusCode::BAD_GATEWAY,
        [(http::header::CONTENT_TYPE, "application/problem+json")],
        body,
    )
        .into_response()
}
