//! What a fleet is made of: its endpoints as given (a list of addresses, or one DNS name that
//! resolves to every host), and the resolver that turns the name into addresses.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use crate::ClientError;
use crate::connect::Address;

/// The environment variable naming a fleet (npuctl's `--fleet`).
pub const FLEET_ENV: &str = "NPUD_FLEET";

/// The hosts of a fleet, as the caller named them.
///
/// | Form | Hosts |
/// |---|---|
/// | `ADDR,ADDR,...` | each address in any form [`Address::parse`] accepts (socket paths, `unix:`, `http://`, `https://`) |
/// | `dns:///NAME:PORT` (also `dns:NAME:PORT`) | every address `NAME` resolves to, as `http://IP:PORT` (plaintext: loopback only unless [`crate::ConnectOptions::allow_plaintext_remote`]) |
/// | `dns+https:///NAME:PORT` | every address `NAME` resolves to, as `https://IP:PORT` (the certificate is checked against the IP unless the connect options name the server) |
///
/// A Kubernetes headless Service is such a name: it resolves to the address of every ready pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetSpec {
    /// A fixed list of daemons.
    Endpoints(Vec<Address>),
    /// A DNS name resolved again and again, so that hosts come and go with its records.
    Dns {
        /// The name to resolve.
        name: String,
        /// The daemons' TCP port.
        port: u16,
        /// Whether to speak TLS (`dns+https`).
        tls: bool,
    },
}

impl FleetSpec {
    /// Parses a fleet (see the [type docs](FleetSpec) for the forms).
    ///
    /// # Errors
    ///
    /// [`ClientError::Address`] for an empty list, an address that does not parse, a DNS form
    /// without a port or with a DNS server in it.
    pub fn parse(text: &str) -> Result<FleetSpec, ClientError> {
        let bad = |reason: String| ClientError::Address {
            address: text.to_owned(),
            reason,
        };
        let t = text.trim();
        for (scheme, tls) in [("dns+https:", true), ("dns:", false)] {
            if let Some(rest) = t.strip_prefix(scheme) {
                let target = match rest.strip_prefix("//") {
                    Some(r) => {
                        let (authority, target) = r.split_once('/').unwrap_or((r, ""));
                        if !authority.is_empty() {
                            return Err(bad(format!(
                                "a DNS server ({authority:?}) cannot be named; the system's \
                                 resolver is used: write {scheme}///NAME:PORT"
                            )));
                        }
                        target
                    }
                    None => rest,
                };
                let Some((name, port)) = target.rsplit_once(':') else {
                    return Err(bad(format!("no port: write {scheme}///NAME:PORT")));
                };
                if name.is_empty() || name.contains('/') {
                    return Err(bad(format!(
                        "{name:?} is not a host name: write {scheme}///NAME:PORT"
                    )));
                }
                let port = match port.parse::<u16>() {
                    Ok(p) if p > 0 => p,
                    _ => return Err(bad(format!("port {port:?}: expected 1-65535"))),
                };
                return Ok(FleetSpec::Dns {
                    name: name.to_owned(),
                    port,
                    tls,
                });
            }
        }
        let mut endpoints: Vec<Address> = Vec::new();
        for part in t.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let a = Address::parse(part)?;
            if !endpoints.contains(&a) {
                endpoints.push(a);
            }
        }
        if endpoints.is_empty() {
            return Err(bad(
                "no endpoints: give addresses separated by commas, or dns:///NAME:PORT".into(),
            ));
        }
        Ok(FleetSpec::Endpoints(endpoints))
    }

    /// The daemon at `ip` of a DNS fleet.
    pub(crate) fn address_of(ip: IpAddr, port: u16, tls: bool) -> Address {
        let scheme = if tls { "https" } else { "http" };
        let uri = match ip {
            IpAddr::V4(v4) => format!("{scheme}://{v4}:{port}"),
            IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{port}"),
        };
        if tls {
            Address::Https(uri)
        } else {
            Address::Http(uri)
        }
    }
}

impl std::fmt::Display for FleetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetSpec::Endpoints(list) => {
                let names: Vec<String> = list.iter().map(ToString::to_string).collect();
                f.write_str(&names.join(","))
            }
            FleetSpec::Dns { name, port, tls } => {
                let scheme = if *tls { "dns+https" } else { "dns" };
                write!(f, "{scheme}:///{name}:{port}")
            }
        }
    }
}

/// A resolution in progress.
pub type Resolving<'a> = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Turns a DNS fleet's name into its hosts' addresses. [`SystemResolver`] by default; inject
/// another through [`crate::FleetOptions::resolver`] (service discovery of your own, tests).
pub trait Resolve: Send + Sync + std::fmt::Debug {
    /// Every address `name` has now.
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> Resolving<'a>;
}

/// The system's resolver (`getaddrinfo`, through tokio).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> Resolving<'a> {
        Box::pin(async move {
            let mut ips: Vec<IpAddr> = tokio::net::lookup_host((name, port))
                .await?
                .map(|a| a.ip())
                .collect();
            ips.sort();
            ips.dedup();
            Ok(ips)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_in_order_without_duplicates() {
        let s = FleetSpec::parse(" /a/s, unix:/b/s ,/a/s,http://127.0.0.1:7 ").unwrap();
        assert_eq!(
            s,
            FleetSpec::Endpoints(vec![
                Address::Unix("/a/s".into()),
                Address::Unix("/b/s".into()),
                Address::Http("http://127.0.0.1:7".into()),
            ])
        );
        assert_eq!(s.to_string(), "unix:/a/s,unix:/b/s,http://127.0.0.1:7");
    }

    #[test]
    fn dns_forms_parse() {
        let want = FleetSpec::Dns {
            name: "npud-hosts.ns.svc".into(),
            port: 50051,
            tls: false,
        };
        assert_eq!(
            FleetSpec::parse("dns:///npud-hosts.ns.svc:50051").unwrap(),
            want
        );
        assert_eq!(
            FleetSpec::parse("dns:npud-hosts.ns.svc:50051").unwrap(),
            want
        );
        assert_eq!(want.to_string(), "dns:///npud-hosts.ns.svc:50051");
        assert_eq!(
            FleetSpec::parse("dns+https:///h.example:443").unwrap(),
            FleetSpec::Dns {
                name: "h.example".into(),
                port: 443,
                tls: true
            }
        );
    }

    #[test]
    fn bad_fleets_say_what_is_wrong() {
        for (text, says) in [
            ("", "no endpoints"),
            (" , ", "no endpoints"),
            ("dns:///hosts", "no port"),
            ("dns:///hosts:0", "expected 1-65535"),
            ("dns:///hosts:x", "expected 1-65535"),
            ("dns://8.8.8.8/hosts:1", "a DNS server"),
            ("dns:///:1", "not a host name"),
            ("/a,ftp://x", "unknown scheme"),
        ] {
            let e = FleetSpec::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn resolved_addresses_become_daemon_addresses() {
        let v4: IpAddr = "127.0.0.2".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        assert_eq!(
            FleetSpec::address_of(v4, 5, false),
            Address::Http("http://127.0.0.2:5".into())
        );
        assert_eq!(
            FleetSpec::address_of(v6, 5, true),
            Address::Https("https://[::1]:5".into())
        );
    }
}
