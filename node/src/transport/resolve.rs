//! Where a peer's `HOST:PORT` points right now. The transport asks on every
//! dial (first contact and each reconnect), never once at start, so a peer
//! whose name moves to another address is reached there on its next dial.
//! The resolver is injected (`TransportOptions::resolver`): the system's
//! (`getaddrinfo`, via tokio) by default, a table in tests.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;

use stele_proto::addr::{Host, HostPort};

pub type ResolveFuture<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// Looks up the addresses of a `HOST:PORT`.
pub trait Resolve: fmt::Debug + Send + Sync + 'static {
    fn resolve<'a>(&'a self, name: &'a HostPort) -> ResolveFuture<'a>;
}

/// The system resolver (hosts file, DNS), asked afresh on every call.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a HostPort) -> ResolveFuture<'a> {
        Box::pin(async move {
            match &name.host {
                Host::Ip(ip) => Ok(vec![SocketAddr::new(*ip, name.port)]),
                Host::Name(host) => Ok(tokio::net::lookup_host((host.as_str(), name.port))
                    .await?
                    .collect()),
            }
        })
    }
}

/// The address to dial from a socket bound to `local`: the first
/// candidate of the socket's family (an IPv4 socket cannot send to IPv6),
/// or any candidate from a dual-stack `[::]` socket.
pub fn pick(local: SocketAddr, candidates: &[SocketAddr]) -> Option<SocketAddr> {
    let dual_stack = local.is_ipv6() && local.ip().is_unspecified();
    candidates
        .iter()
        .copied()
        .find(|c| dual_stack || c.is_ipv4() == local.is_ipv4())
}

/// Resolves `name` and picks the address to dial from `endpoint`.
pub async fn dial_address(
    resolver: &dyn Resolve,
    endpoint: &quinn::Endpoint,
    name: &HostPort,
) -> Result<SocketAddr, String> {
    let local = endpoint.local_addr().map_err(|e| e.to_string())?;
    let found = resolver
        .resolve(name)
        .await
        .map_err(|e| format!("resolve {name}: {e}"))?;
    pick(local, &found).ok_or_else(|| {
        format!("{name} resolves to {found:?}, none of them of the family of {local}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_address_of_the_sockets_family() {
        let v4: SocketAddr = "10.0.0.1:7".parse().unwrap();
        let v4b: SocketAddr = "10.0.0.2:7".parse().unwrap();
        let v6: SocketAddr = "[fd00::1]:7".parse().unwrap();
        let local4: SocketAddr = "0.0.0.0:1".parse().unwrap();
        let local6: SocketAddr = "[::1]:1".parse().unwrap();
        let dual: SocketAddr = "[::]:1".parse().unwrap();
        assert_eq!(pick(local4, &[v6, v4, v4b]), Some(v4));
        assert_eq!(pick(local6, &[v4, v6]), Some(v6));
        assert_eq!(pick(dual, &[v4, v6]), Some(v4));
        assert_eq!(pick(local4, &[v6]), None);
        assert_eq!(pick(local4, &[]), None);
    }

    #[tokio::test]
    async fn the_system_resolver_reads_ips_without_lookup_and_names_with_one() {
        let ip: HostPort = "127.0.0.1:9".parse().unwrap();
        assert_eq!(
            SystemResolver.resolve(&ip).await.unwrap(),
            vec!["127.0.0.1:9".parse::<SocketAddr>().unwrap()]
        );
        let name: HostPort = "localhost:9".parse().unwrap();
        let found = SystemResolver.resolve(&name).await.unwrap();
        assert!(
            found.iter().all(|a| a.ip().is_loopback() && a.port() == 9) && !found.is_empty(),
            "{found:?}"
        );
        // `.invalid` never resolves (RFC 6761).
        let nowhere: HostPort = "no-such-host.invalid:9".parse().unwrap();
        assert!(SystemResolver.resolve(&nowhere).await.is_err());
    }
}
