//! TLS settings of the Redis backends: the authority a server's certificate is checked against
//! and the client's own certificate, given to a builder (feature `tls`), applied to every
//! connection the backend opens (commands, notifications, the watcher; every node of a
//! cluster; the sentinels and the primary they name).
//!
//! redis-rs parses the PEM once, when a client is made from the settings ([`TlsSettings::apply`]),
//! into the root store and key every later connection and reconnection uses; with the
//! compiled-in public roots (webpki-roots) no connection reads certificate files either.

use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError};

use crate::LockError;

/// The certificates given to a builder; none by default (a `rediss://` URL then trusts the
/// public roots and presents no client certificate).
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// The authorities (PEM) that signed the servers' certificates, instead of the public roots.
    ca_pem: Option<Vec<u8>>,
    /// The client's certificate chain and private key (PEM), for mutual TLS.
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    #[cfg(feature = "tls")]
    pub(crate) fn set_ca(&mut self, ca_pem: &[u8]) {
        self.ca_pem = Some(ca_pem.to_vec());
    }

    #[cfg(feature = "tls")]
    pub(crate) fn set_identity(&mut self, cert_pem: &[u8], key_pem: &[u8]) {
        self.identity = Some((cert_pem.to_vec(), key_pem.to_vec()));
    }

    /// Whether a certificate was given.
    pub(crate) fn is_set(&self) -> bool {
        self.ca_pem.is_some() || self.identity.is_some()
    }

    /// The certificates in redis-rs's form, when some were given.
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        self.is_set().then(|| redis::TlsCertificates {
            client_tls: self
                .identity
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca_pem.clone(),
        })
    }

    /// `info` with these certificates parsed into it (a `rediss://` address), or unchanged
    /// when none were given. Readies rustls's crypto provider for a TLS address.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for certificates given with a URL that is not `rediss://`,
    /// or PEM that does not parse.
    pub(crate) fn apply(&self, info: ConnectionInfo) -> Result<ConnectionInfo, LockError> {
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        if tls {
            ready_provider();
        }
        if !self.is_set() {
            return Ok(info);
        }
        if !tls {
            return Err(LockError::config(
                "TLS certificates were given to the builder (tls, tls_identity), but the URL is not a rediss:// one: \
                 use rediss://host:port/ for TLS",
            ));
        }
        self.parse_into(info)
    }

    #[cfg(feature = "tls")]
    fn parse_into(&self, info: ConnectionInfo) -> Result<ConnectionInfo, LockError> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        // redis-rs takes PEM without a certificate as an empty set of roots (every server
        // refused later, at connect): refused here, with what was wrong.
        let certificates_in = |pem: &[u8]| CertificateDer::pem_slice_iter(pem).count();
        if self
            .ca_pem
            .as_deref()
            .is_some_and(|ca| certificates_in(ca) == 0)
        {
            return Err(LockError::config(
                "the PEM given to the builder's `tls` holds no certificate (expected -----BEGIN CERTIFICATE-----)",
            ));
        }
        if self
            .identity
            .as_ref()
            .is_some_and(|(cert, _)| certificates_in(cert) == 0)
        {
            return Err(LockError::config(
                "the certificate PEM given to the builder's `tls_identity` holds no certificate (expected -----BEGIN CERTIFICATE-----)",
            ));
        }
        let certificates = self.certificates().unwrap_or(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        });
        redis::Client::build_with_tls(info, certificates)
            .map(|client| client.get_connection_info().clone())
            .map_err(|e| LockError::config(format!("cannot use the TLS certificates given: {e}")))
    }

    #[cfg(not(feature = "tls"))]
    fn parse_into(&self, info: ConnectionInfo) -> Result<ConnectionInfo, LockError> {
        Ok(info)
    }
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A private key is never printed.
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca_pem.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// Installs ring as rustls's process-wide crypto provider when none is: rustls would panic
/// at the first TLS connection if two providers were compiled in (another crate of the
/// application enabling aws-lc-rs) and the application installed none. An application's own
/// choice, installed before, is kept.
#[cfg(feature = "tls")]
fn ready_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may install one meanwhile: then that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(not(feature = "tls"))]
fn ready_provider() {}

/// Parses a Redis URL, with `expected` (the forms the caller accepts) in the error.
pub(crate) fn parse_url(url: &str, expected: &str) -> Result<ConnectionInfo, LockError> {
    url.into_connection_info()
        .map_err(|e| url_error(url, &e, expected))
}

/// A URL redis-rs refused: what it said, the forms expected, and for `rediss://` without
/// this crate's `tls` feature, the feature to enable.
pub(crate) fn url_error(url: &str, e: &RedisError, expected: &str) -> LockError {
    let hint = if cfg!(not(feature = "tls")) && url.trim_start().starts_with("rediss://") {
        "; rediss:// (TLS) needs lock-core's `tls` feature"
    } else {
        ""
    };
    LockError::config(format!(
        "cannot parse the Redis URL ({e}); expected {expected}{hint}"
    ))
}

/// Whether `info` reaches its server over TLS.
pub(crate) fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}
