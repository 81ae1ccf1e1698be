//! The command line: flags, their checks, and the usage text.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;

use super::server;

pub(crate) const USAGE: &str = "\
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

pub(crate) struct Args {
    pub(crate) command: String,
    pub(crate) config: PathBuf,
    pub(crate) listen: SocketAddr,
    pub(crate) upstream: Option<Uri>,
    pub(crate) redis: Option<tollgate::rules::RedisTarget>,
    pub(crate) log_level: String,
    pub(crate) log_format: LogFormat,
    pub(crate) log_raw_keys: bool,
    pub(crate) metrics_listen: Option<SocketAddr>,
    pub(crate) admin_listen: Option<SocketAddr>,
    pub(crate) admin_tokens: Option<PathBuf>,
    pub(crate) limits: server::Limits,
    pub(crate) upstream_limits: UpstreamLimits,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// How long the upstream may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpstreamLimits {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

impl Default for UpstreamLimits {
    fn default() -> Self {
        UpstreamLimits {
            connect: Duration::from_secs(5),
            response: Duration::from_secs(30),
        }
    }
}

pub(crate) fn duration(flag: &str, text: &str) -> Result<Duration, String> {
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
pub(crate) struct RedisFlags {
    pub(crate) url: Option<String>,
    pub(crate) cluster: Vec<String>,
    pub(crate) sentinel: Vec<String>,
    pub(crate) master: Option<String>,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
    pub(crate) lease: Option<String>,
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

pub(crate) fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
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
