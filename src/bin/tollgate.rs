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

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::Router;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tollgate::RateLimitLayer;
use tollgate::backend::BackendErrorKind;
use tollgate::rules::Rules;

#[path = "tollgate/admin.rs"]
mod admin;
#[path = "tollgate/args.rs"]
mod args;
#[path = "tollgate/intermediary.rs"]
mod intermediary;
#[path = "tollgate/metrics.rs"]
mod metrics;
#[path = "tollgate/per_ip.rs"]
mod per_ip;
#[path = "tollgate/proxy.rs"]
mod proxy;
#[path = "tollgate/rls.rs"]
mod rls;

use args::{Args, LogFormat, USAGE, parse_args};
use proxy::{Upstream, echo, proxy};

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
