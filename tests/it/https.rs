//! HTTPS of a real `maasd` (`http.tls_cert`, `http.tls_key`): the API and
//! the console answer over TLS to a client that trusts the CA, with
//! `Strict-Transport-Security`; plain HTTP gets nothing; a key without its
//! certificate stops the daemon at start, naming the setting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};
use reqwest::StatusCode;
use serde_json::json;

use crate::support::GENEROUS;
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::TestDb;

const TOKEN: &str = "tok-https";

/// A CA and a server certificate for `localhost` and 127.0.0.1, written as
/// PEM files into a directory of their own: (dir, CA certificate PEM).
fn certificates() -> (PathBuf, String) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "maas test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert: Certificate = ca.self_signed(&ca_key).unwrap();
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("https-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
    (dir, ca_cert.pem())
}

fn tls_opts(dir: &Path) -> Opts {
    Opts::default()
        .env("MAAS_API_TOKENS", TOKEN)
        .env("MAAS_ARCHIVIST__ENABLED", "false")
        .env("MAAS_HTTP__TLS_CERT", dir.join("server.pem").display())
        .env("MAAS_HTTP__TLS_KEY", dir.join("server.key").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_the_api_and_the_console_with_hsts() {
    let db = TestDb::new().await;
    let (dir, ca) = certificates();
    let mut d = Maasd::spawn(&db.url, tls_opts(&dir));
    let port = d.http_addr(GENEROUS).await.port();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let base = format!("https://localhost:{port}");
    let mut ready = None;
    for _ in 0..300 {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await
            && r.status() == StatusCode::OK
        {
            ready = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ready = ready.unwrap_or_else(|| panic!("no HTTPS readiness:\n{}", d.plain_log()));
    assert_eq!(
        ready.headers()["strict-transport-security"].to_str().unwrap(),
        "max-age=31536000"
    );

    let submitted = client
        .post(format!("{base}/api/query"))
        .bearer_auth(TOKEN)
        .json(&json!({ "user_id": uuid::Uuid::new_v4(), "query": "over TLS" }))
        .send()
        .await
        .unwrap();
    assert_eq!(submitted.status(), StatusCode::ACCEPTED);
    let login = client.get(format!("{base}/console/login")).send().await.unwrap();
    assert_eq!(login.status(), StatusCode::OK);
    assert!(login.headers().contains_key("strict-transport-security"));

    // Plain HTTP on the same port gets no answer, and a client that does
    // not trust the CA is refused.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .timeout(Duration::from_secs(15))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP answered: {plain:?}");
    let untrusting = reqwest::Client::new().get(format!("{base}/readyz")).send().await;
    assert!(untrusting.is_err(), "an unknown CA was accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_needs_both_the_certificate_and_the_key() {
    let db = TestDb::new().await;
    let (dir, _) = certificates();
    let mut d = Maasd::spawn(
        &db.url,
        Opts::default()
            .env("MAAS_API_TOKENS", TOKEN)
            .env("MAAS_HTTP__TLS_KEY", dir.join("server.key").display()),
    );
    let failed = d
        .wait_http_addr(GENEROUS)
        .await
        .expect_err("started without a certificate");
    assert!(failed.contains("http.tls_key is set without http.tls_cert"), "{failed}");

    std::fs::write(dir.join("server.pem"), "not a certificate").unwrap();
    let mut d = Maasd::spawn(&db.url, tls_opts(&dir));
    let failed = d
        .wait_http_addr(GENEROUS)
        .await
        .expect_err("started with a broken certificate");
    assert!(failed.contains("http.tls_cert"), "{failed}");
}
