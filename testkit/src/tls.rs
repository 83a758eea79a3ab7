//! Certificates for TLS tests ([`TlsCerts`]): a certificate authority, a server certificate
//! it signed for `127.0.0.1` and `localhost`, a client certificate it signed, and a second,
//! unrelated authority; made with the `openssl` command-line tool in a temporary directory.
//!
//! The `openssl` binary rather than a crate (rcgen): it is on every machine that has a
//! Debian redis-server (whose TLS is OpenSSL's; `apt-get install -y openssl` otherwise), it
//! costs the tests' build nothing, and the certificates are made the way an operator makes
//! them. Elliptic-curve keys (P-256): a set takes about 50 ms.

#![allow(
    clippy::panic,
    reason = "a test harness that cannot do its job fails the test using it, loudly and with the cause"
)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tempdir::TempDir;

/// A certificate authority, the server and client certificates it signed, and another
/// authority that signed nothing of these; files in a temporary directory removed on drop.
///
/// The server certificate names `127.0.0.1` and `localhost` (subject alternative names) and
/// may also serve as a client certificate (Redis presents its own certificate to its primary,
/// to the other nodes of a cluster, and a sentinel to the servers it watches).
///
/// ```
/// let certs = lock_testkit::TlsCerts::generate();
/// assert!(String::from_utf8(certs.ca_pem()).unwrap().contains("BEGIN CERTIFICATE"));
/// assert_ne!(certs.ca_pem(), certs.other_ca_pem());
/// ```
#[derive(Debug)]
pub struct TlsCerts {
    dir: TempDir,
}

impl TlsCerts {
    /// Makes a fresh set: `ca.crt`, `server.crt`/`server.key`, `client.crt`/`client.key`,
    /// `other-ca.crt`.
    ///
    /// # Panics
    /// When `openssl` is missing (the message names the package) or fails (with its output).
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// assert!(certs.server_cert_path().exists());
    /// ```
    pub fn generate() -> Self {
        let dir = TempDir::new();
        let d = dir.path();
        authority(d, "ca", "lock-testkit CA");
        authority(d, "other-ca", "lock-testkit unrelated CA");
        leaf(
            d,
            "server",
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        );
        leaf(
            d,
            "client",
            "lock-testkit client",
            "extendedKeyUsage=clientAuth\n",
        );
        Self { dir }
    }

    /// The authority's certificate (PEM), for a client to trust.
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// assert!(!certs.ca_pem().is_empty());
    /// ```
    pub fn ca_pem(&self) -> Vec<u8> {
        self.read("ca.crt")
    }

    /// The unrelated authority's certificate (PEM): a client that trusts it alone refuses the
    /// servers.
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// assert_ne!(certs.other_ca_pem(), certs.ca_pem());
    /// ```
    pub fn other_ca_pem(&self) -> Vec<u8> {
        self.read("other-ca.crt")
    }

    /// The client's certificate (PEM), signed by the authority.
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// assert!(!certs.client_cert_pem().is_empty());
    /// ```
    pub fn client_cert_pem(&self) -> Vec<u8> {
        self.read("client.crt")
    }

    /// The client's private key (PEM, PKCS#8).
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// assert!(String::from_utf8(certs.client_key_pem()).unwrap().contains("PRIVATE KEY"));
    /// ```
    pub fn client_key_pem(&self) -> Vec<u8> {
        self.read("client.key")
    }

    /// The authority's certificate file (`--tls-ca-cert-file`).
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// assert!(certs.ca_path().exists());
    /// ```
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server's certificate file (`--tls-cert-file`).
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// assert!(certs.server_cert_path().exists());
    /// ```
    pub fn server_cert_path(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server's private key file (`--tls-key-file`).
    ///
    /// ```
    /// let certs = lock_testkit::TlsCerts::generate();
    /// assert!(certs.server_key_path().exists());
    /// ```
    pub fn server_key_path(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    fn read(&self, name: &str) -> Vec<u8> {
        let path = self.dir.path().join(name);
        fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    }
}

/// `<name>.crt` and `<name>.key`: a self-signed authority (CA:TRUE, P-256), valid 2 days.
fn authority(dir: &Path, name: &str, cn: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={cn}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
        ],
    );
}

/// `<name>.crt` and `<name>.key`: a P-256 key and its certificate signed by `ca`, with the
/// extensions `ext` (OpenSSL's config syntax) beside `basicConstraints=CA:FALSE`.
fn leaf(dir: &Path, name: &str, cn: &str, ext: &str) {
    let ext_file = format!("{name}.ext");
    let ext_path = dir.join(&ext_file);
    fs::write(&ext_path, format!("basicConstraints=CA:FALSE\n{ext}"))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", ext_path.display()));
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext_file,
            "-out",
            &format!("{name}.crt"),
        ],
    );
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run openssl ({e}): the TLS tests need it (apt-get install -y openssl)")
        });
    if !out.status.success() {
        panic!(
            "openssl {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
