//! Network addresses as operators write them: `HOST:PORT`, where the host
//! is a name (`localhost`, `node1`, `node1.example.com`), an IPv4 literal
//! or a bracketed IPv6 literal (`[::1]:7450`). One type for every listen,
//! advertise and peer flag and for the endpoints nodes report, so the
//! binary, the node and the controller read them the same way.
//!
//! A name is kept as written and resolved when it is dialled or bound,
//! never once at start: a peer whose name moves is reached at its new
//! address on the next dial.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// Why a `HOST:PORT` (or an endpoint URL) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{0:?}: want HOST:PORT (a name, an IPv4 address, or [IPv6]:PORT)")]
    MissingPort(String),
    #[error("{0:?}: the port is not a number from 0 to 65535")]
    BadPort(String),
    #[error("{0:?}: the host is empty")]
    EmptyHost(String),
    #[error("{0:?}: an IPv6 address needs brackets, as in [::1]:7450")]
    Ipv6NeedsBrackets(String),
    #[error(
        "{0:?}: not a host name (letters, digits, '-', '_' and '.'; at most 253 characters) or an IP address"
    )]
    BadHost(String),
    #[error("{0:?}: want an http:// or https:// URL with a HOST:PORT")]
    BadUrl(String),
    #[error("{0} is an unspecified address (0.0.0.0 or ::): nobody can dial it")]
    Unspecified(HostPort),
    #[error("{0} has port 0: nobody can dial it")]
    PortZero(HostPort),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The host part: a literal IP or a name resolved when used.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    Ip(IpAddr),
    /// A DNS or hosts-file name, lower-cased.
    Name(String),
}

/// `HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    pub host: Host,
    pub port: u16,
}

impl HostPort {
    pub fn new(host: Host, port: u16) -> HostPort {
        HostPort { host, port }
    }

    /// `0.0.0.0` or `::`: fine to listen on, never to advertise.
    pub fn is_unspecified(&self) -> bool {
        matches!(self.host, Host::Ip(ip) if ip.is_unspecified())
    }

    /// Refuses what another machine could not dial: an unspecified
    /// address or port 0.
    pub fn dialable(&self) -> Result<&HostPort> {
        if self.is_unspecified() {
            return Err(Error::Unspecified(self.clone()));
        }
        if self.port == 0 {
            return Err(Error::PortZero(self.clone()));
        }
        Ok(self)
    }

    /// The literal socket address, if the host is an IP (no lookup).
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match self.host {
            Host::Ip(ip) => Some(SocketAddr::new(ip, self.port)),
            Host::Name(_) => None,
        }
    }

    /// The same host on another port (a listener bound to port 0).
    pub fn with_port(&self, port: u16) -> HostPort {
        HostPort::new(self.host.clone(), port)
    }

    /// `http://HOST:PORT`, the form of a gRPC endpoint.
    pub fn http_url(&self) -> String {
        format!("http://{self}")
    }

    /// `https://HOST:PORT`, a gRPC endpoint over TLS.
    pub fn https_url(&self) -> String {
        format!("https://{self}")
    }

    /// Reads the `HOST:PORT` of an `http://` or `https://` endpoint URL
    /// (a trailing `/` allowed, nothing else after the port).
    pub fn from_url(url: &str) -> Result<HostPort> {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .ok_or_else(|| Error::BadUrl(url.to_string()))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('@') {
            return Err(Error::BadUrl(url.to_string()));
        }
        rest.parse()
    }
}

/// A `HOST:PORT` another machine can dial (what a node reports as its
/// peer endpoint).
pub fn dialable(s: &str) -> Result<HostPort> {
    let hp: HostPort = s.parse()?;
    hp.dialable()?;
    Ok(hp)
}

/// The `HOST:PORT` of an endpoint URL another machine can dial (what a
/// node reports as its client endpoint).
pub fn dialable_url(url: &str) -> Result<HostPort> {
    let hp = HostPort::from_url(url)?;
    hp.dialable()?;
    Ok(hp)
}

impl From<SocketAddr> for HostPort {
    fn from(a: SocketAddr) -> HostPort {
        HostPort::new(Host::Ip(a.ip()), a.port())
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Name(n) => f.write_str(n),
        }
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

// As a string in config files and JSON: `"node1:7450"`.
impl serde::Serialize for HostPort {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for HostPort {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<HostPort, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Longest host name (RFC 1035, without the trailing dot).
const NAME_BYTES_MAX: usize = 253;
/// Longest label of a host name.
const LABEL_BYTES_MAX: usize = 63;

fn valid_name(name: &str) -> bool {
    // Underscores are not RFC 1123, but container runtimes hand them out
    // as host names and resolvers accept them.
    name.len() <= NAME_BYTES_MAX
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= LABEL_BYTES_MAX
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

impl FromStr for HostPort {
    type Err = Error;

    fn from_str(s: &str) -> Result<HostPort> {
        let own = || s.to_string();
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (ip, port) = rest
                .split_once("]:")
                .ok_or_else(|| Error::MissingPort(own()))?;
            let ip: std::net::Ipv6Addr = ip.parse().map_err(|_| Error::BadHost(own()))?;
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = s
                .rsplit_once(':')
                .ok_or_else(|| Error::MissingPort(own()))?;
            // A URL where HOST:PORT belongs is a bad host, not IPv6.
            if host.contains('/') {
                return Err(Error::BadHost(own()));
            }
            if host.contains(':') {
                return Err(Error::Ipv6NeedsBrackets(own()));
            }
            if host.is_empty() {
                return Err(Error::EmptyHost(own()));
            }
            let host = match host.parse::<std::net::Ipv4Addr>() {
                Ok(ip) => Host::Ip(IpAddr::V4(ip)),
                // All-digit dotted names are malformed IPv4, not names.
                Err(_) if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
                    return Err(Error::BadHost(own()));
                }
                Err(_) if valid_name(host) => Host::Name(host.to_ascii_lowercase()),
                Err(_) => return Err(Error::BadHost(own())),
            };
            (host, port)
        };
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::BadPort(own()));
        }
        let port = port.parse().map_err(|_| Error::BadPort(own()))?;
        Ok(HostPort { host, port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str, display: &str) {
        let hp: HostPort = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(hp.to_string(), display, "{s}");
        assert_eq!(
            display.parse::<HostPort>().unwrap(),
            hp,
            "round trip of {s}"
        );
    }

    fn bad(s: &str, want: fn(String) -> Error) {
        assert_eq!(s.parse::<HostPort>(), Err(want(s.to_string())), "{s}");
    }

    #[test]
    fn parses_names_ipv4_and_bracketed_ipv6() {
        ok("localhost:7450", "localhost:7450");
        ok("Node1:7450", "node1:7450");
        ok("node-1.cell_a.example.com:1", "node-1.cell_a.example.com:1");
        ok("127.0.0.1:7450", "127.0.0.1:7450");
        ok("0.0.0.0:0", "0.0.0.0:0");
        ok("[::1]:7450", "[::1]:7450");
        ok("[::]:65535", "[::]:65535");
        ok("[fe80::1:2]:80", "[fe80::1:2]:80");
        assert_eq!(
            "[::1]:9".parse::<HostPort>().unwrap().socket_addr(),
            Some("[::1]:9".parse().unwrap())
        );
        assert_eq!("node1:9".parse::<HostPort>().unwrap().socket_addr(), None);
    }

    #[test]
    fn refuses_what_is_not_host_port() {
        bad("nonsense", Error::MissingPort);
        bad("", Error::MissingPort);
        bad(":7450", Error::EmptyHost);
        bad("::1:7450", Error::Ipv6NeedsBrackets);
        bad("[::1]7450", Error::MissingPort);
        bad("[nope]:1", Error::BadHost);
        bad("host:", Error::BadPort);
        bad("host:65536", Error::BadPort);
        bad("host:+1", Error::BadPort);
        bad("host:http", Error::BadPort);
        bad("300.1.1.1:1", Error::BadHost);
        bad("1.2.3:1", Error::BadHost);
        bad("-node:1", Error::BadHost);
        bad("a..b:1", Error::BadHost);
        bad("sp ace:1", Error::BadHost);
        bad("http://x:1", Error::BadHost);
        bad(&format!("{}:1", "a".repeat(64)), Error::BadHost);
    }

    #[test]
    fn unspecified_and_port_zero_are_not_dialable() {
        for s in ["0.0.0.0:7450", "[::]:7450"] {
            let hp: HostPort = s.parse().unwrap();
            assert!(hp.is_unspecified());
            assert_eq!(hp.dialable(), Err(Error::Unspecified(hp.clone())));
        }
        let zero: HostPort = "node1:0".parse().unwrap();
        assert_eq!(zero.dialable(), Err(Error::PortZero(zero.clone())));
        let fine: HostPort = "node1:7450".parse().unwrap();
        assert_eq!(fine.dialable(), Ok(&fine));
        assert_eq!(fine.with_port(1).to_string(), "node1:1");
    }

    #[test]
    fn urls_carry_a_host_port() {
        let hp = HostPort::from_url("http://node1:7450").unwrap();
        assert_eq!(hp.to_string(), "node1:7450");
        assert_eq!(hp.http_url(), "http://node1:7450");
        assert_eq!(
            HostPort::from_url("https://[::1]:7450/")
                .unwrap()
                .to_string(),
            "[::1]:7450"
        );
        for u in ["node1:7450", "ftp://a:1", "http://a:1/path", "http://u@a:1"] {
            assert_eq!(HostPort::from_url(u), Err(Error::BadUrl(u.into())), "{u}");
        }
        assert!(dialable_url("http://node1:7450").is_ok());
        assert!(matches!(
            dialable_url("http://0.0.0.0:7450"),
            Err(Error::Unspecified(_))
        ));
        assert!(matches!(dialable("[::]:7550"), Err(Error::Unspecified(_))));
        assert!(matches!(dialable("node1:0"), Err(Error::PortZero(_))));
        assert_eq!(
            HostPort::from_url("http://a"),
            Err(Error::MissingPort("a".into()))
        );
    }
}
