//! Certificates for the TLS tests, made in the test with rcgen.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// A CA and the certificates it signs, written as PEM files in `dir`.
#[derive(Debug)]
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
    dir: PathBuf,
    name: String,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, format!("npud test {name}"));
        let cert = p.self_signed(&key).unwrap();
        let pem = cert.pem();
        std::fs::write(dir.join(format!("{name}.pem")), &pem).unwrap();
        Ca {
            issuer: Issuer::new(p, key),
            pem,
            dir: dir.to_path_buf(),
            name: name.to_owned(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(format!("{}.pem", self.name))
    }

    /// A leaf certificate with these subject alternative names (none: only the common name
    /// `cn`), as (cert, key) files named `file`.crt / `file`.key.
    pub fn leaf(&self, file: &str, sans: &[&str], cn: &str, server: bool) -> (PathBuf, PathBuf) {
        let names = sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let sans = CertificateParams::new(names).unwrap().subject_alt_names;
        self.sign(file, sans, cn, server)
    }

    /// A client certificate with exactly these subject alternative names and common name
    /// `file`.
    pub fn leaf_with(&self, file: &str, sans: Vec<rcgen::SanType>) -> (PathBuf, PathBuf) {
        self.sign(file, sans, file, false)
    }

    pub fn sign(
        &self,
        file: &str,
        sans: Vec<rcgen::SanType>,
        cn: &str,
        server: bool,
    ) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.subject_alt_names = sans;
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            self.dir.join(format!("{file}.crt")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    pub fn server(&self, file: &str) -> (PathBuf, PathBuf) {
        self.leaf(file, &["localhost", "127.0.0.1"], "npud", true)
    }
}
