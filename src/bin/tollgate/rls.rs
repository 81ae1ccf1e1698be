//! `tollgate rls`: Envoy's rate limit service, configured by
//! envoyproxy/ratelimit's YAML files (see `tollgate::rls`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tollgate::backend::{OnFailure, RedisBackend};
use tollgate::rls::{LoadOptions, OnBackendError, RlsConfig, RlsService};
use tollgate::rules::AnyBackend;
use tollgate::{Algorithm, MemoryBackend};

pub const USAGE: &str = "\
tollgate rls: Envoy's rate limit service (envoy.service.ratelimit.v3)

usage:
  tollgate rls --config PATH [--listen ADDR] [--redis URL]... [--redis-lease MODE]
               [--redis-timeout T] [--on-backend-error error|allow|deny|memory]
               [--algorithm NAME] [--merge-domains] [--metrics-listen ADDR]
               [--log-level LEVEL]
  tollgate rls --config PATH [--merge-domains] --check

options:
  --config PATH        a file or a directory of envoyproxy/ratelimit YAML files,
                       reloaded when they change
  --listen ADDR        where to serve gRPC (default 127.0.0.1:8081)
  --redis URL          keep the counters in Redis; give it several times for the
                       nodes of a Redis Cluster
  --redis-lease MODE   lease quota from Redis in batches: off (default), auto, or
                       the most units one lease holds
  --redis-timeout T    how long a Redis call may take (default 50ms)
  --on-backend-error P when Redis fails or times out: error (default: a gRPC
                       error, Envoy's failure_mode_deny decides), allow, deny,
                       or memory (count in this process until Redis is back)
  --algorithm NAME     the algorithm of limits that name none: sliding_window
                       (default), fixed_window (the reference's), sliding_log,
                       token_bucket, leaky_bucket or gcra
  --merge-domains      files that name the same domain add their top-level
                       descriptors to it instead of being refused (also
                       MERGE_DOMAIN_CONFIG=true, as the reference reads it)
  --metrics-listen ADDR
                       serve Prometheus metrics at http://ADDR/metrics
  --check              validate the configuration and exit
";

struct Args {
    config: PathBuf,
    listen: SocketAddr,
    redis: Vec<String>,
    lease: String,
    redis_timeout: Duration,
    on_error: String,
    algorithm: Option<Algorithm>,
    merge_domains: bool,
    metrics_listen: Option<SocketAddr>,
    log_level: String,
    check: bool,
}

impl Args {
    fn load_options(&self) -> LoadOptions {
        LoadOptions {
            algorithm: self.algorithm,
            merge_domains: self.merge_domains,
        }
    }
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        config: PathBuf::new(),
        listen: ([127, 0, 0, 1], 8081).into(),
        redis: Vec::new(),
        lease: "off".into(),
        redis_timeout: Duration::from_millis(50),
        on_error: "error".into(),
        algorithm: None,
        merge_domains: false,
        metrics_listen: None,
        log_level: "info".into(),
        check: false,
    };
    let mut config = None;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--config" => config = Some(PathBuf::from(value()?)),
            "--listen" => {
                let v = value()?;
                parsed.listen = v
                    .parse()
                    .map_err(|_| format!("--listen {v:?}: give ip:port"))?;
            }
            "--metrics-listen" => {
                let v = value()?;
                let addr = v
                    .parse()
                    .map_err(|_| format!("--metrics-listen {v:?}: give ip:port"))?;
                parsed.metrics_listen = Some(addr);
            }
            "--redis" => parsed.redis.push(value()?),
            "--redis-lease" => parsed.lease = value()?,
            "--redis-timeout" => parsed.redis_timeout = super::args::duration(&flag, &value()?)?,
            "--on-backend-error" => parsed.on_error = value()?,
            "--algorithm" => {
                let v = value()?;
                let a = Algorithm::ALL
                    .into_iter()
                    .find(|a| a.name() == v)
                    .ok_or(format!("--algorithm {v:?}: unknown algorithm"))?;
                parsed.algorithm = Some(a);
            }
            "--merge-domains" => parsed.merge_domains = true,
            "--log-level" => parsed.log_level = value()?,
            "--check" => parsed.check = true,
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    parsed.config = config.ok_or("--config is required")?;
    // The flag wins over the variable; a variable that is set but not a
    // boolean stops the start, as it stops the reference's.
    parsed.merge_domains |= LoadOptions::merge_domains_from_env()?;
    Ok(parsed)
}

fn backend(args: &Args) -> Result<(AnyBackend, OnBackendError), String> {
    let (on_error, fallback) = match args.on_error.as_str() {
        "error" => (OnBackendError::Error, false),
        "allow" => (OnBackendError::Allow, false),
        "deny" => (OnBackendError::Deny, false),
        "memory" => (OnBackendError::Error, true),
        other => {
            return Err(format!(
                "--on-backend-error {other:?}: give error, allow, deny or memory"
            ));
        }
    };
    if args.redis.is_empty() {
        return Ok((AnyBackend::Memory(MemoryBackend::new()), on_error));
    }
    let builder = match args.redis.as_slice() {
        [one] => RedisBackend::from_url(one.clone()),
        many => RedisBackend::from_cluster_urls(many.iter().cloned()),
    };
    let lease = args
        .lease
        .parse()
        .map_err(|e| format!("--redis-lease: {e}"))?;
    let on_failure = if fallback {
        OnFailure::Fallback(MemoryBackend::new())
    } else {
        OnFailure::Error
    };
    let redis = builder
        .prefix("tollgate:rls:")
        .timeout(args.redis_timeout)
        .on_failure(on_failure)
        .lease(lease)
        .build()
        .map_err(|e| format!("--redis: {e}"))?;
    Ok((AnyBackend::Redis(redis), on_error))
}

/// Runs `tollgate rls` with the arguments after `rls`.
pub fn main(args: impl Iterator<Item = String>) -> ExitCode {
    let args = match parse_args(args) {
        Ok(args) => args,
        Err(message) if message.is_empty() => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("tollgate rls: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let config = match RlsConfig::load(&args.config, args.load_options()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("tollgate rls: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.check {
        println!(
            "{}: valid; domains: {}",
            args.config.display(),
            config.domains().join(", ")
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate rls: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args, config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate rls: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args, config: RlsConfig) -> Result<(), String> {
    if let Some(addr) = args.metrics_listen {
        let handle = super::metrics::install()?;
        super::metrics::serve(addr, handle, super::server::Limits::default())
            .await
            .map_err(|e| format!("--metrics-listen: {e}"))?;
    }
    // Built inside the runtime: the Redis pool needs one.
    let (backend, on_error) = backend(&args)?;
    if let Some(e) = super::refusal(&backend).await {
        return Err(e.to_string());
    }
    let algorithm = args.algorithm.unwrap_or(tollgate::rls::DEFAULT_ALGORITHM);
    let service = RlsService::with_options(config, backend, on_error, algorithm);
    service.watch(
        &args.config,
        args.load_options(),
        Duration::from_millis(250),
    );
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(listen = %local, "tollgate rls serving");
    tokio::select! {
        served = service.serve(listener) => served.map_err(|e| e.to_string()),
        () = super::shutdown() => {
            tracing::info!("tollgate rls stopped");
            Ok(())
        }
    }
}
