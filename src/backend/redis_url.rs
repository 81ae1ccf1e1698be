//! Redis URLs as shown: with their passwords hidden. Outside the `redis`
//! feature, as a rules file names Redis whether or not it is built in.

/// `url` with its password hidden (`redis://tg:***@host:6379`), for output
/// and error messages: the userinfo is taken as everything before the last
/// `@`, even past a `/` or `#` (a password written unencoded may hold them,
/// and over-hiding a query costs nothing). A userinfo without `:` is hidden
/// whole, as some write the password there alone.
pub(crate) fn redis_url_redacted(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let shown = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    format!("{}{shown}{}", &url[..start], &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::redis_url_redacted as redact;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(
            redact("redis://tg:S3cretPw@127.0.0.1:6379/0"),
            "redis://tg:***@127.0.0.1:6379/0"
        );
        assert_eq!(redact("rediss://:pw@h:1"), "rediss://:***@h:1");
        assert_eq!(redact("redis://pw@h"), "redis://***@h");
        assert_eq!(redact("redis://a:b@c@h/0"), "redis://a:***@h/0");
        assert_eq!(redact("redis://u:pa/ss#x@h"), "redis://u:***@h");
        assert_eq!(redact("redis://h"), "redis://h");
        assert_eq!(redact("not a url"), "not a url");
    }
}
