//! `--admin-listen ADDR` and `--admin-token-file FILE`: the admin API
//! (`tollgate::admin`) on a listener of its own, behind bearer tokens.

use std::hash::Hasher;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;
use tollgate::admin::AdminCaller;
use tollgate::rules::Rules;

/// The most tokens a file holds, and the longest line read.
const MAX_TOKENS: usize = 1_000;
const MAX_TOKEN_FILE_BYTES: u64 = 256 * 1024;

/// How often the top offenders' gauges are set.
const TOP_METRICS_EVERY: Duration = Duration::from_secs(10);

/// The tokens that may call the admin API, by name. Kept as keyed hashes:
/// comparing two 16-byte digests in constant time says nothing of a
/// token's length or of where a guess first differs.
pub struct Tokens {
    key: (u64, u64),
    tokens: Vec<(String, [u8; 16])>,
}

impl Tokens {
    /// Reads `path`: one `name:token` a line; blank lines and lines
    /// starting with `#` are skipped. Errors never quote a token.
    pub fn read(path: &Path) -> Result<Tokens, String> {
        let shown = path.display();
        let meta =
            std::fs::metadata(path).map_err(|e| format!("--admin-token-file {shown}: {e}"))?;
        if !meta.is_file() || meta.len() > MAX_TOKEN_FILE_BYTES {
            return Err(format!(
                "--admin-token-file {shown}: not a regular file of at most {MAX_TOKEN_FILE_BYTES} bytes"
            ));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--admin-token-file {shown}: {e}"))?;
        let key = (random_u64(), random_u64());
        let mut tokens = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("--admin-token-file {shown}: line {}: {why}", i + 1);
            let Some((name, token)) = line.split_once(':') else {
                return Err(bad("write name:token"));
            };
            let (name, token) = (name.trim(), token.trim());
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(bad("a token's name is letters, digits, '-', '_' and '.'"));
            }
            if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(bad("a token is at least 16 visible ASCII characters"));
            }
            if tokens.iter().any(|(n, _)| n == name) {
                return Err(bad("two tokens have this name"));
            }
            tokens.push((name.to_owned(), digest(key, token.as_bytes())));
        }
        if tokens.is_empty() {
            return Err(format!("--admin-token-file {shown}: holds no token"));
        }
        if tokens.len() > MAX_TOKENS {
            return Err(format!(
                "--admin-token-file {shown}: more than {MAX_TOKENS} tokens"
            ));
        }
        Ok(Tokens { key, tokens })
    }

    /// The name of the token `given`, if it is one. Every token is
    /// compared, whichever matches.
    fn name_of(&self, given: &str) -> Option<&str> {
        let given = digest(self.key, given.as_bytes());
        let mut found = None;
        for (name, token) in &self.tokens {
            if bool::from(token.ct_eq(&given)) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

fn digest(key: (u64, u64), bytes: &[u8]) -> [u8; 16] {
    let mut h = siphasher::sip128::SipHasher13::new_with_keys(key.0, key.1);
    h.write(bytes);
    siphasher::sip128::Hasher128::finish128(&h).as_bytes()
}

fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(std::time::SystemTime::now())
}

fn problem(status: StatusCode, detail: &str) -> Response {
    tollgate::layer::problem_response(status, "about:blank", detail).map(axum::body::Body::from)
}

/// Refuses a call without a token (401) or with a wrong one (403); names
/// the caller for the change log otherwise.
async fn authenticate(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    let given = (request.headers().get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(given) = given else {
        let mut r = problem(
            StatusCode::UNAUTHORIZED,
            "Give a token: Authorization: Bearer <token>.",
        );
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return r;
    };
    let Some(name) = tokens.name_of(given.trim()) else {
        tracing::warn!(target: "tollgate::admin", "admin call with a wrong token refused");
        return problem(StatusCode::FORBIDDEN, "This token is not allowed.");
    };
    let name = name.to_owned();
    request.extensions_mut().insert(AdminCaller(name));
    next.run(request).await
}

/// Serves the admin API at `addr` until the process ends, with the limited
/// port's connection limits, and sets the top offenders' gauges.
pub async fn serve(
    addr: SocketAddr,
    tokens: Option<Tokens>,
    rules: Rules,
    limits: super::server::Limits,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(
        listen = %listener.local_addr()?,
        tokens = tokens.is_some(),
        "admin API at /v1"
    );
    let mut app = tollgate::admin::router(rules.clone());
    if let Some(tokens) = tokens {
        app = app.layer(axum::middleware::from_fn_with_state(
            Arc::new(tokens),
            authenticate,
        ));
    }
    let weak = rules.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(TOP_METRICS_EVERY);
        loop {
            every.tick().await;
            tollgate::admin::publish_top_metrics(&weak, 10);
        }
    });
    tokio::spawn(super::server::serve(
        listener,
        app,
        limits,
        Arc::new(|_| false),
        std::future::pending(),
    ));
    Ok(())
}
