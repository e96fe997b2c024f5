//! TLS to PostgreSQL with rustls, for every connection maas makes: the
//! pool, the LISTEN session, the migration session and `maasctl`.
//!
//! The connection string's libpq parameters decide ([`crate::config::pgtls`]):
//!
//! - `sslmode=disable`: plain TCP. `prefer` (the default): TLS when the
//!   server offers it, else plain; the certificate is not checked.
//! - `require`: TLS or no connection. Without `sslrootcert` the certificate
//!   is not checked (the handshake signature still is); with it, as
//!   `verify-ca` (libpq does the same).
//! - `verify-ca`: the server's chain must lead to a root in `sslrootcert`.
//!   `verify-full`: and the certificate must name the host connected to
//!   (`host`, even when `hostaddr` gives the address).
//! - `sslrootcert`: a PEM file of certificate authorities, or `system` for
//!   the Mozilla roots built in (webpki-roots). When `verify-ca`/`verify-full`
//!   name none, `~/.postgresql/root.crt` is used, as libpq does, and its
//!   absence is an error.
//! - `sslcert` + `sslkey`: a PEM client certificate (chain) and key, sent
//!   when the server asks (`cert` authentication, `clientcert=verify-full`).
//!
//! Files are read when a connector is made ([`connector`]), so a rotated
//! CA file is picked up at the next reconnect. A failed handshake names the
//! host, the sslmode and the CA file.

use std::fmt::Write as _;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::pgtls::{self, SslMode, TlsParams};

/// The TLS settings of a connection string could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("database_url: {0}")]
    Mode(#[from] pgtls::BadSslMode),
    #[error("database_url: cannot read {what} `{path}`: {problem}")]
    File {
        what: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error("database_url: {0}")]
    Setup(String),
}

impl From<TlsError> for super::Error {
    fn from(e: TlsError) -> Self {
        super::Error::Setup(e.to_string())
    }
}

/// The connector for the connection string `conn`.
pub fn connector(conn: &str) -> Result<MakeTls, TlsError> {
    let (_, params) = pgtls::split(conn)?;
    make(&params)
}

/// A client configuration for tokio-postgres: `conn` without the TLS keys it
/// does not know, parsed, plus the connector that honours them.
pub fn split(conn: &str) -> Result<(String, MakeTls), TlsError> {
    let (rest, params) = pgtls::split(conn)?;
    Ok((rest, make(&params)?))
}

/// Builds the connector for `params`.
pub fn make(params: &TlsParams) -> Result<MakeTls, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Setup(format!("TLS protocol versions: {e}")))?;
    let mode = match (params.mode, &params.root_cert) {
        (SslMode::Require, Some(_)) => SslMode::VerifyCa,
        (m, _) => m,
    };
    let root_file = match mode {
        SslMode::VerifyCa | SslMode::VerifyFull => Some(match &params.root_cert {
            Some(p) => p.clone(),
            None => default_root_cert().ok_or_else(|| {
                TlsError::Setup(format!(
                    "sslmode={} needs sslrootcert=<file of CA certificates> (or sslrootcert=system); \
                     ~/.postgresql/root.crt does not exist either",
                    mode.as_str()
                ))
            })?,
        }),
        _ => None,
    };
    let builder = match &root_file {
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient { provider, chain: None })),
        Some(file) => {
            let roots = Arc::new(load_roots(file)?);
            if mode == SslMode::VerifyFull {
                builder.with_root_certificates(roots)
            } else {
                let chain = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| TlsError::Setup(format!("sslrootcert `{}`: {e}", file.display())))?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(Lenient {
                    provider,
                    chain: Some(chain),
                }))
            }
        }
    };
    let config = match (&params.cert, &params.key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = load_certs(cert, "sslcert")?;
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
                what: "sslkey",
                path: key.clone(),
                problem: e.to_string(),
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| TlsError::Setup(format!("sslcert/sslkey do not make a client certificate: {e}")))?
        }
        _ => {
            return Err(TlsError::Setup(
                "sslcert and sslkey go together: give both or neither".into(),
            ));
        }
    };
    let mut context = format!("sslmode={}", params.mode.as_str());
    if let Some(f) = &root_file {
        let _ = write!(context, ", sslrootcert={}", f.display());
    }
    Ok(MakeTls {
        inner: MakeRustlsConnect::new(config),
        context: context.into(),
    })
}

fn default_root_cert() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".postgresql").join("root.crt");
    p.exists().then_some(p)
}

fn load_roots(file: &Path) -> Result<RootCertStore, TlsError> {
    if file.as_os_str() == "system" {
        return Ok(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        });
    }
    let mut roots = RootCertStore::empty();
    for cert in load_certs(file, "sslrootcert")? {
        roots.add(cert).map_err(|e| TlsError::File {
            what: "sslrootcert",
            path: file.to_owned(),
            problem: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

fn load_certs(file: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |problem: String| TlsError::File {
        what,
        path: file.to_owned(),
        problem,
    };
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// A verifier looser than rustls' own. The handshake must always be signed
/// by the certificate's key (so the session is at least encrypted to the
/// holder of that key). Without `chain` (`require`/`prefer`) any
/// certificate is accepted; with it (`verify-ca`) the chain is checked
/// (webpki checks it before the name) and a name mismatch alone is
/// accepted.
#[derive(Debug)]
struct Lenient {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The connector handed to tokio-postgres and the pool: rustls underneath,
/// with handshake errors that say what was checked.
#[derive(Clone)]
pub struct MakeTls {
    inner: MakeRustlsConnect,
    context: Arc<str>,
}

impl<S> MakeTlsConnect<S> for MakeTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = Connect<S>;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> Result<Self::TlsConnect, Self::Error> {
        let inner = match <MakeRustlsConnect as MakeTlsConnect<S>>::make_tls_connect(&mut self.inner, host) {
            Ok(c) => c,
            Err(never) => match never {},
        };
        Ok(Connect {
            inner,
            host: host.to_owned(),
            context: self.context.clone(),
        })
    }
}

/// One handshake (see [`MakeTls`]).
pub struct Connect<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    inner: <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect,
    host: String,
    context: Arc<str>,
}

type Handshake<T> = Pin<Box<dyn Future<Output = io::Result<T>> + Send>>;

impl<S> TlsConnect<S> for Connect<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type Error = io::Error;
    type Future = Handshake<Self::Stream>;

    fn connect(self, stream: S) -> Self::Future {
        let Connect { inner, host, context } = self;
        let handshake = inner.connect(stream);
        Box::pin(async move {
            handshake
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("TLS with `{host}` refused ({context}): {e}")))
        })
    }
}
