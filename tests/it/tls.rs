//! TLS to PostgreSQL: a private cluster with `ssl = on` and a certificate
//! chain made here (a CA, a server certificate for `localhost`, a client
//! certificate), against the library's connector, `maasctl` and `maasd`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use maas::db::devdb::{Cluster, ClusterSpec, ensure_database};
use rcgen::{BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair};

use crate::support::cli::{NO_ENV, maasctl_async};
use crate::support::daemon::{Maasd, Opts};
use crate::support::db::{connect, ensure_login_role};
use crate::support::ops::{insert_one, wait_status};

/// The TLS cluster and the files the tests point at.
struct Tls {
    port: u16,
    dir: PathBuf,
}

impl Tls {
    fn file(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// `postgres://{user}@{host}:{port}/{db}?hostaddr=127.0.0.1&{params}`: the
    /// host name is what the certificate is checked against, the address is
    /// where the server listens.
    fn url(&self, user: &str, host: &str, db: &str, params: &str) -> String {
        format!(
            "postgres://{user}@{host}:{}/{db}?hostaddr=127.0.0.1&{params}",
            self.port
        )
    }

    fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable", self.port)
    }
}

fn make_ca(name: &str) -> (Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

fn leaf(names: &[&str], cn: &str, issuer: &(Certificate, KeyPair)) -> (String, String) {
    let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer.0, &issuer.1).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// Made once per test run: new certificates each time, the cluster kept.
fn tls() -> &'static Tls {
    static TLS: OnceLock<Tls> = OnceLock::new();
    TLS.get_or_init(|| {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let dir = base.join("maas-tls-files");
        std::fs::create_dir_all(&dir).unwrap();
        let ca = make_ca("maas test CA");
        let other = make_ca("another CA");
        let (server_cert, server_key) = leaf(&["localhost"], "localhost", &ca);
        let (client_cert, client_key) = leaf(&[], "maas_cert", &ca);
        write(&dir, "ca.pem", &ca.0.pem());
        write(&dir, "other-ca.pem", &other.0.pem());
        write(&dir, "client.pem", &client_cert);
        write(&dir, "client.key", &client_key);
        let spec = ClusterSpec {
            dir: base.join("maas-tls-pg"),
            port: None,
            durable: false,
            max_connections: 100,
        };
        let cluster = Cluster::ensure(&spec).unwrap();
        cluster
            .enable_tls(&server_cert, &server_key, Some((&ca.0.pem(), "maas_cert")))
            .unwrap();
        cluster.restart(false).unwrap();
        Tls {
            port: cluster.port,
            dir,
        }
    })
}

/// Connects with maas's own connector; whether the session is encrypted,
/// or the error as a person reads it.
async fn session_ssl(url: &str) -> Result<bool, String> {
    let pg = maas::db::pg_config(url, "maas-tls-test").map_err(|e| e.to_string())?;
    let connector = maas::db::tls::connector(url).map_err(|e| e.to_string())?;
    let (client, conn) = pg.connect(connector).await.map_err(|e| maas::error::chain(&e))?;
    tokio::spawn(conn);
    let row = client
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .map_err(|e| maas::error::chain(&e))?;
    Ok(row.get(0))
}

#[tokio::test]
async fn verify_full_needs_the_right_ca_and_host_name() {
    let t = tls();
    let ca = format!("sslrootcert={}", t.file("ca.pem"));
    let good = t.url(
        "postgres",
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&{ca}"),
    );
    assert_eq!(session_ssl(&good).await, Ok(true));

    // The certificate names `localhost`, not the address.
    let wrong_host = t.url(
        "postgres",
        "127.0.0.1",
        "postgres",
        &format!("sslmode=verify-full&{ca}"),
    );
    let e = session_ssl(&wrong_host).await.unwrap_err();
    assert!(
        e.contains("TLS with `127.0.0.1` refused (sslmode=verify-full") && e.contains("not valid for name"),
        "{e}"
    );

    let other = format!("sslrootcert={}", t.file("other-ca.pem"));
    let wrong_ca = t.url(
        "postgres",
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&{other}"),
    );
    let e = session_ssl(&wrong_ca).await.unwrap_err();
    assert!(
        e.contains("TLS with `localhost` refused (sslmode=verify-full") && e.contains("UnknownIssuer"),
        "{e}"
    );

    // verify-ca checks the chain only; the same wrong CA still fails.
    let ca_only = t.url("postgres", "127.0.0.1", "postgres", &format!("sslmode=verify-ca&{ca}"));
    assert_eq!(session_ssl(&ca_only).await, Ok(true));
    let ca_only_wrong = t.url(
        "postgres",
        "127.0.0.1",
        "postgres",
        &format!("sslmode=verify-ca&{other}"),
    );
    assert!(session_ssl(&ca_only_wrong).await.unwrap_err().contains("UnknownIssuer"));

    // A CA file that is missing is named.
    let missing = t.url(
        "postgres",
        "localhost",
        "postgres",
        "sslmode=verify-full&sslrootcert=no-such-ca.pem",
    );
    let e = session_ssl(&missing).await.unwrap_err();
    assert!(e.contains("sslrootcert `no-such-ca.pem`"), "{e}");
}

#[tokio::test]
async fn require_prefer_and_disable_do_what_libpq_does() {
    let t = tls();
    // require: encrypted, no CA needed, host name not checked.
    let require = t.url("postgres", "127.0.0.1", "postgres", "sslmode=require");
    assert_eq!(session_ssl(&require).await, Ok(true));
    // require with a CA is verify-ca (libpq's rule).
    let require_ca = t.url(
        "postgres",
        "127.0.0.1",
        "postgres",
        &format!("sslmode=require&sslrootcert={}", t.file("other-ca.pem")),
    );
    assert!(session_ssl(&require_ca).await.unwrap_err().contains("UnknownIssuer"));
    // prefer (the default) takes TLS when offered.
    let prefer = t.url("postgres", "127.0.0.1", "postgres", "application_name=x");
    assert_eq!(session_ssl(&prefer).await, Ok(true));
    assert_eq!(session_ssl(&t.admin_url()).await, Ok(false));
    // The key/value form works the same.
    let kv = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert='{}'",
        t.port,
        t.file("ca.pem")
    );
    assert_eq!(session_ssl(&kv).await, Ok(true));

    // prefer falls back to plain on a server without TLS (the shared test
    // cluster); require refuses it.
    let plain = crate::support::db::admin_url();
    if !plain.contains("sslmode") {
        assert_eq!(session_ssl(&plain).await, Ok(false));
        let sep = if plain.contains('?') { '&' } else { '?' };
        let e = session_ssl(&format!("{plain}{sep}sslmode=require")).await.unwrap_err();
        assert!(e.contains("TLS"), "{e}");
    }
}

#[tokio::test]
async fn a_client_certificate_logs_in_where_the_server_requires_one() {
    let t = tls();
    let admin = connect(&t.admin_url()).await;
    ensure_login_role(&admin, "maas_cert").await;
    let with_cert = t.url(
        "maas_cert",
        "localhost",
        "postgres",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            t.file("ca.pem"),
            t.file("client.pem"),
            t.file("client.key")
        ),
    );
    assert_eq!(session_ssl(&with_cert).await, Ok(true));
    let without = t.url(
        "maas_cert",
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={}", t.file("ca.pem")),
    );
    let e = session_ssl(&without).await.unwrap_err();
    assert!(e.contains("certificate"), "{e}");
    let half = format!("{without}&sslcert={}", t.file("client.pem"));
    assert!(
        session_ssl(&half)
            .await
            .unwrap_err()
            .contains("sslcert and sslkey go together")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maasctl_and_maasd_work_over_verify_full() {
    let t = tls();
    let db = format!("maas_tls_{}", uuid::Uuid::new_v4().simple());
    ensure_database(&t.admin_url(), &db).await.unwrap();
    let ca = format!("sslmode=verify-full&sslrootcert={}", t.file("ca.pem"));
    let url = t.url("postgres", "localhost", &db, &ca);

    // A wrong CA: maasctl stops with the reason.
    let wrong = t.url(
        "postgres",
        "localhost",
        &db,
        &format!("sslmode=verify-full&sslrootcert={}", t.file("other-ca.pem")),
    );
    let (code, _, err) = maasctl_async(&wrong, &["migrate"], NO_ENV).await;
    assert_ne!(code, 0);
    assert!(
        err.contains("UnknownIssuer") && err.contains("sslmode=verify-full"),
        "{err}"
    );

    let (code, out, err) = maasctl_async(&url, &["migrate"], NO_ENV).await;
    assert_eq!(code, 0, "{out}{err}");

    let d = Maasd::spawn(&url, Opts::default());
    let c = connect(&t.url("postgres", "127.0.0.1", &db, "sslmode=disable")).await;
    let id = insert_one(&c, "over TLS").await;
    wait_status(&c, id, "COMPLETED").await;
    // Every maasd session (pool and LISTEN) is encrypted.
    let plain: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.datname = current_database() AND a.application_name LIKE 'maasd%' AND NOT s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let listener: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.datname = current_database() AND a.application_name = 'maasd-listener' AND s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!((plain, listener), (0, 1), "{}", d.plain_log());
}
