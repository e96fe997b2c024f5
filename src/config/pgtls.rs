//! The TLS parameters of a PostgreSQL connection string, as libpq names
//! them: `sslmode`, `sslrootcert`, `sslcert`, `sslkey`.
//!
//! tokio-postgres knows only `sslmode` = `disable`/`prefer`/`require` and
//! refuses every other TLS key, so [`split`] takes the TLS parameters out of
//! the string (URL form `postgres://…?sslmode=verify-full&sslrootcert=…`
//! or key/value form `host=… sslmode=verify-full`) and leaves a string
//! tokio-postgres accepts, with `verify-ca`/`verify-full` written as
//! `require` (TLS or no connection; the certificate check is ours,
//! `db::tls`). Every other parameter is passed through unchanged.
//!
//! Pure: no files are read here.

use std::path::PathBuf;

/// What is checked of the server, lowest first (libpq's meanings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS when the server offers it, plain otherwise; the certificate is
    /// not checked. libpq's default, and ours. (`allow` is read as this.)
    Prefer,
    /// TLS or no connection; the certificate is checked only when
    /// `sslrootcert` is given (then as `verify-ca`, as libpq does).
    Require,
    /// TLS, and the server's chain leads to a root of `sslrootcert`.
    VerifyCa,
    /// `verify-ca`, and the certificate names the host connected to.
    VerifyFull,
}

impl SslMode {
    pub fn parse(s: &str) -> Option<SslMode> {
        Some(match s {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// The value tokio-postgres gets for `sslmode`.
    fn for_driver(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => "require",
        }
    }
}

/// The TLS parameters of one connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsParams {
    pub mode: SslMode,
    /// PEM file of the certificate authorities to trust, or `system` for
    /// the bundled Mozilla roots.
    pub root_cert: Option<PathBuf>,
    /// PEM client certificate (chain) and its private key.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// A connection string with an `sslmode` value libpq does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sslmode `{0}` is not one of disable, allow, prefer, require, verify-ca, verify-full")]
pub struct BadSslMode(pub String);

/// Splits `conn` into the string for tokio-postgres and the TLS parameters.
pub fn split(conn: &str) -> Result<(String, TlsParams), BadSslMode> {
    let trimmed = conn.trim();
    let url_form = trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://");
    let mut params = TlsParams {
        mode: SslMode::Prefer,
        root_cert: None,
        cert: None,
        key: None,
    };
    let mut take = |key: &str, value: &str| -> Result<Option<String>, BadSslMode> {
        match key {
            "sslmode" => {
                params.mode = SslMode::parse(value).ok_or_else(|| BadSslMode(value.to_owned()))?;
                Ok(Some(params.mode.for_driver().to_owned()))
            }
            "sslrootcert" => {
                params.root_cert = Some(PathBuf::from(value));
                Ok(None)
            }
            "sslcert" => {
                params.cert = Some(PathBuf::from(value));
                Ok(None)
            }
            "sslkey" => {
                params.key = Some(PathBuf::from(value));
                Ok(None)
            }
            _ => Ok(Some(value.to_owned())),
        }
    };
    let rest = if url_form {
        let Some((base, query)) = trimmed.split_once('?') else {
            return Ok((conn.to_owned(), params));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(k);
            match take(&key, &percent_decode(v))? {
                Some(driver_mode) if key == "sslmode" => kept.push(format!("sslmode={driver_mode}")),
                Some(_) => kept.push(pair.to_owned()),
                None => {}
            }
        }
        if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else {
        let Some(pairs) = key_values(trimmed) else {
            // Malformed: tokio-postgres reports it in its own words.
            return Ok((conn.to_owned(), params));
        };
        let mut out = Vec::new();
        for (k, v) in pairs {
            if let Some(v) = take(&k, &v)? {
                out.push(format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")));
            }
        }
        out.join(" ")
    };
    Ok((rest, params))
}

/// `key = value` pairs of the key/value form (values quoted with `'` or
/// bare, `\` escaping the next character), or `None` when malformed.
fn key_values(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.peek().is_none() {
            return Some(out);
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        it.next_if_eq(&'=')?;
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next()? {
                    '\'' => break,
                    '\\' => value.push(it.next()?),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = it.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.push(it.next()?);
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn url_form_loses_the_keys_tokio_postgres_refuses() {
        let (rest, p) = split(
            "postgres://u:p@db.example.com:5432/maas?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&sslcert=c.pem&sslkey=k.pem",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u:p@db.example.com:5432/maas?application_name=x&sslmode=require"
        );
        assert_eq!(p.mode, SslMode::VerifyFull);
        assert_eq!(p.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(p.cert, Some(PathBuf::from("c.pem")));
        assert_eq!(p.key, Some(PathBuf::from("k.pem")));
        rest.parse::<tokio_postgres::Config>().unwrap();
    }

    #[test]
    fn key_value_form_keeps_quoted_values() {
        let (rest, p) =
            split(r"host=h dbname = 'my db' password='it\'s' sslmode=verify-ca sslrootcert='/a b/ca.pem'").unwrap();
        assert_eq!(p.mode, SslMode::VerifyCa);
        assert_eq!(p.root_cert, Some(PathBuf::from("/a b/ca.pem")));
        let cfg: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(cfg.get_dbname(), Some("my db"));
        assert_eq!(cfg.get_password(), Some(&b"it's"[..]));
        assert_eq!(cfg.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
    }

    #[test]
    fn defaults_and_refusals() {
        let (rest, p) = split("postgres://u@h/db").unwrap();
        assert_eq!((rest.as_str(), p.mode), ("postgres://u@h/db", SslMode::Prefer));
        let (rest, p) = split("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(
            (rest.as_str(), p.mode),
            ("postgres://u@h/db?sslmode=disable", SslMode::Disable)
        );
        assert_eq!(split("host=h sslmode=verify").unwrap_err(), BadSslMode("verify".into()));
        assert_eq!(
            split("postgres://h/db?sslrootcert=ca.pem").unwrap().0,
            "postgres://h/db"
        );
    }
}
