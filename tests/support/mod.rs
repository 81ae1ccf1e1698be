//! The one support module of every test binary: here a real HTTP server on
//! a loopback port, a client, and a parser for the structured-field headers;
//! in its modules the servers the tests start (one module a kind), each
//! stopped on drop. Each binary uses a part, hence `dead_code` allowed.

#![allow(dead_code)]

pub mod conformance;
#[cfg(feature = "gateway")]
pub mod envoy;
pub mod gate;
#[cfg(feature = "gateway")]
pub mod gateway;
pub mod process;
pub mod redis;
// `counting_alloc.rs` is not a module of it: a `#[global_allocator]`, it is
// included only by the binaries that measure memory.

use std::net::SocketAddr;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Serves `app` on a free loopback port, recording peer addresses.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// All lines of a list header, joined as one list.
    pub fn list(&self, name: &str) -> Vec<Member> {
        let joined: Vec<&str> = self
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        parse_list(&joined.join(", ")).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn get(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Reply {
    let mut req = Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, http::HeaderValue::from_bytes(v).unwrap());
    }
    let resp = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    reply(resp).await
}

/// Collects a `oneshot` response.
pub async fn reply<B>(resp: http::Response<B>) -> Reply
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A bare item or parameter value of a structured field.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    String(String),
    Integer(i64),
    Token(String),
    Bool(bool),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub item: Value,
    pub params: Vec<(String, Value)>,
}

impl Member {
    pub fn name(&self) -> &str {
        match &self.item {
            Value::String(s) => s,
            other => panic!("member is not a string: {other:?}"),
        }
    }

    pub fn int(&self, key: &str) -> i64 {
        match self.params.iter().find(|(k, _)| k == key) {
            Some((_, Value::Integer(n))) => *n,
            other => panic!("parameter {key}: {other:?} in {self:?}"),
        }
    }
}

/// An RFC 9651 list of items with parameters (no inner lists), strictly.
pub fn parse_list(s: &str) -> Result<Vec<Member>, String> {
    let mut p = Parser {
        s: s.as_bytes(),
        i: 0,
    };
    let mut out = Vec::new();
    p.ows();
    if p.done() {
        return Ok(out);
    }
    loop {
        let item = p.bare()?;
        let mut params = Vec::new();
        while p.peek() == Some(b';') {
            p.i += 1;
            p.sp();
            let key = p.key()?;
            let value = if p.peek() == Some(b'=') {
                p.i += 1;
                p.bare()?
            } else {
                Value::Bool(true)
            };
            params.push((key, value));
        }
        out.push(Member { item, params });
        p.ows();
        if p.done() {
            return Ok(out);
        }
        if p.peek() != Some(b',') {
            return Err(format!("expected ',' at {} in {s:?}", p.i));
        }
        p.i += 1;
        p.ows();
        if p.done() {
            return Err("trailing comma".into());
        }
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn done(&self) -> bool {
        self.i >= self.s.len()
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }
    fn sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }
    fn key(&mut self) -> Result<String, String> {
        let start = self.i;
        match self.peek() {
            Some(c) if c.is_ascii_lowercase() || c == b'*' => {}
            other => return Err(format!("bad key start {other:?}")),
        }
        while matches!(self.peek(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c))
        {
            self.i += 1;
        }
        Ok(String::from_utf8(self.s[start..self.i].to_vec()).unwrap())
    }
    fn bare(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some(b'"') => {
                self.i += 1;
                let mut out = String::new();
                loop {
                    match self.peek() {
                        None => return Err("unterminated string".into()),
                        Some(b'\\') => {
                            self.i += 1;
                            match self.peek() {
                                Some(c @ (b'"' | b'\\')) => out.push(c as char),
                                other => return Err(format!("bad escape {other:?}")),
                            }
                            self.i += 1;
                        }
                        Some(b'"') => {
                            self.i += 1;
                            return Ok(Value::String(out));
                        }
                        Some(c) if (0x20..0x7f).contains(&c) => {
                            out.push(c as char);
                            self.i += 1;
                        }
                        Some(c) => return Err(format!("bad string byte {c}")),
                    }
                }
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.i;
                self.i += 1;
                while matches!(self.peek(), Some(c) if c.is_ascii_digit()) {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                if text.len() > 16 {
                    return Err("integer too long".into());
                }
                text.parse().map(Value::Integer).map_err(|e| e.to_string())
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'*' => {
                let start = self.i;
                while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c))
                {
                    self.i += 1;
                }
                Ok(Value::Token(
                    String::from_utf8(self.s[start..self.i].to_vec()).unwrap(),
                ))
            }
            Some(b'?') => {
                self.i += 1;
                let v = self.peek() == Some(b'1');
                self.i += 1;
                Ok(Value::Bool(v))
            }
            other => Err(format!("bad item start {other:?}")),
        }
    }
}

#[test]
fn parser_reads_the_drafts_example() {
    let l = parse_list(r#""burst";q=100;w=60,"daily";q=1000;w=86400"#).unwrap();
    assert_eq!(l.len(), 2);
    assert_eq!(
        (l[1].name(), l[1].int("q"), l[1].int("w")),
        ("daily", 1000, 86400)
    );
    assert!(parse_list(r#""a";q=1,"#).is_err());
    assert!(parse_list(r#"a"b"#).is_err());
}

/// A configuration file as a careless edit leaves it: `cut.1` bytes cut at
/// `cut.0`, `insert.1` inserted at `insert.0`, and line `repeat` appended
/// again (each place moved back to a character boundary). For the parsers'
/// property tests: errors are fine, panics are not.
pub fn damaged(text: &str, cut: (usize, usize), insert: (usize, &str), repeat: usize) -> String {
    let at = |n: usize, t: &str| {
        (0..=n.min(t.len()))
            .rev()
            .find(|&i| t.is_char_boundary(i))
            .unwrap_or(0)
    };
    let mut text = text.to_owned();
    let start = at(cut.0, &text);
    let end = at(start + cut.1, &text);
    text.replace_range(start..end, "");
    let pos = at(insert.0, &text);
    text.insert_str(pos, insert.1);
    if let Some(line) = text.lines().nth(repeat).map(str::to_owned) {
        text.push_str(&line);
        text.push('\n');
    }
    text
}
