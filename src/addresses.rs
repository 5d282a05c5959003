//! Listen and advertise: where a server binds, and the `HOST:PORT` it
//! tells others to dial (routes, heartbeats, leader hints).
//!
//! ```text
//! --listen HOST:PORT ──┐             ┌─► bind (a name is looked up to bind)
//! --advertise HOST:PORT┴─► Endpoint ─┤
//!                         (checked    └─► advertised(bound): --advertise, or
//!                          before          the listen host with the bound port
//!                          anything binds)
//! ```
//!
//! An unspecified address (`0.0.0.0`, `::`) is fine to listen on and is
//! never advertised: listening on one without an advertise flag is refused
//! at start-up, naming the flag to set, and so is advertising one (or
//! port 0). The check is pure ([`Endpoint::new`]); only [`bind_address`]
//! looks anything up.

use std::net::SocketAddr;

use stele_proto::addr::{self, HostPort};

/// The flag pair of one listener, named in refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flags {
    pub listen: &'static str,
    pub advertise: &'static str,
}

/// The client (gRPC, TCP) listener of every role.
pub const CLIENT: Flags = Flags {
    listen: "--listen",
    advertise: "--advertise",
};

/// The node-to-node (QUIC, UDP) listener of a node.
pub const PEER: Flags = Flags {
    listen: "--peer-listen",
    advertise: "--peer-advertise",
};

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "{listen} {addr} listens on every interface, which nobody can dial: set {advertise} HOST:PORT to the name or address others should use"
    )]
    NeedAdvertise {
        listen: &'static str,
        advertise: &'static str,
        addr: HostPort,
    },
    #[error("{flag}: {source}")]
    Undialable {
        flag: &'static str,
        source: addr::Error,
    },
}

/// A listener's address and what is advertised for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub listen: HostPort,
    advertise: Option<HostPort>,
}

impl Endpoint {
    /// Checks a listen/advertise pair before anything binds.
    pub fn new(
        flags: Flags,
        listen: HostPort,
        advertise: Option<HostPort>,
    ) -> Result<Endpoint, Error> {
        match &advertise {
            Some(a) => {
                a.dialable().map_err(|source| Error::Undialable {
                    flag: flags.advertise,
                    source,
                })?;
            }
            None if listen.is_unspecified() => {
                return Err(Error::NeedAdvertise {
                    listen: flags.listen,
                    advertise: flags.advertise,
                    addr: listen,
                });
            }
            None => {}
        }
        Ok(Endpoint { listen, advertise })
    }

    /// What others are told to dial once the listener is bound at `bound`:
    /// the advertise flag, or the listen host (as written: a name stays a
    /// name) with the bound port (a listen port 0 gets its real port).
    pub fn advertised(&self, bound: SocketAddr) -> HostPort {
        match &self.advertise {
            Some(a) => a.clone(),
            None => self.listen.with_port(bound.port()),
        }
    }
}

/// The socket address to bind a listen `HOST:PORT` to: the literal, or
/// the first address its name resolves to now.
pub async fn bind_address(flag: &str, listen: &HostPort) -> anyhow::Result<SocketAddr> {
    if let Some(a) = listen.socket_addr() {
        return Ok(a);
    }
    let found = tokio::net::lookup_host(listen.to_string())
        .await
        .map_err(|e| anyhow::anyhow!("{flag} {listen}: cannot resolve the name: {e}"))?
        .next();
    found.ok_or_else(|| anyhow::anyhow!("{flag} {listen}: the name resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(s: &str) -> HostPort {
        s.parse().unwrap()
    }

    fn check(listen: &str, advertise: Option<&str>, bound: &str, want: Result<&str, Error>) {
        let got = Endpoint::new(CLIENT, hp(listen), advertise.map(hp))
            .map(|e| e.advertised(bound.parse().unwrap()).to_string());
        assert_eq!(got, want.map(str::to_string), "{listen} {advertise:?}");
    }

    #[test]
    fn the_advertised_endpoint_is_the_flag_or_a_specified_listen_address() {
        check(
            "127.0.0.1:7450",
            None,
            "127.0.0.1:7450",
            Ok("127.0.0.1:7450"),
        );
        check(
            "127.0.0.1:0",
            None,
            "127.0.0.1:40123",
            Ok("127.0.0.1:40123"),
        );
        check("node1:7450", None, "10.0.0.5:7450", Ok("node1:7450"));
        check("[::1]:7450", None, "[::1]:7450", Ok("[::1]:7450"));
        check(
            "0.0.0.0:7450",
            Some("node1:7450"),
            "0.0.0.0:7450",
            Ok("node1:7450"),
        );
        check(
            "[::]:7450",
            Some("10.1.2.3:9000"),
            "[::]:7450",
            Ok("10.1.2.3:9000"),
        );
    }

    #[test]
    fn an_unspecified_address_is_never_advertised() {
        for listen in ["0.0.0.0:7450", "[::]:7450", "0.0.0.0:0"] {
            check(
                listen,
                None,
                "0.0.0.0:7450",
                Err(Error::NeedAdvertise {
                    listen: "--listen",
                    advertise: "--advertise",
                    addr: hp(listen),
                }),
            );
        }
        for advertise in ["0.0.0.0:1", "[::]:7450"] {
            check(
                "127.0.0.1:7450",
                Some(advertise),
                "127.0.0.1:7450",
                Err(Error::Undialable {
                    flag: "--advertise",
                    source: addr::Error::Unspecified(hp(advertise)),
                }),
            );
        }
        check(
            "0.0.0.0:7450",
            Some("node1:0"),
            "0.0.0.0:7450",
            Err(Error::Undialable {
                flag: "--advertise",
                source: addr::Error::PortZero(hp("node1:0")),
            }),
        );
        let e = Endpoint::new(PEER, hp("0.0.0.0:7550"), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--peer-listen 0.0.0.0:7550 listens on every interface, which nobody can dial: set --peer-advertise HOST:PORT to the name or address others should use"
        );
    }
}
