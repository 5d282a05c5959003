//! A client of a small quorum (the cell controllers, the directory): finds
//! the leader among the endpoints it was given (following `NotLeader`
//! hints), and retries through an election for a bounded time. Used for
//! routes, namespace lookups and operator commands.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use stele_proto::pb::controller_client::ControllerClient;
use stele_proto::pb::directory_client::DirectoryClient;
use tonic::transport::{Channel, Endpoint};

use crate::{Error, Result};

/// A gRPC client made from a channel.
pub trait FromChannel {
    fn from_channel(ch: Channel) -> Self;
}

impl FromChannel for ControllerClient<Channel> {
    fn from_channel(ch: Channel) -> Self {
        ControllerClient::new(ch)
    }
}

impl FromChannel for DirectoryClient<Channel> {
    fn from_channel(ch: Channel) -> Self {
        DirectoryClient::new(ch)
    }
}

/// Calls to the cell controllers.
pub type Admin = Leader<ControllerClient<Channel>>;
/// Calls to the directory.
pub type DirectoryAdmin = Leader<DirectoryClient<Channel>>;

pub struct Leader<C> {
    endpoints: Mutex<Vec<String>>,
    at: AtomicUsize,
    /// How long a call keeps trying while no controller leads.
    pub deadline: Duration,
    pub request_timeout: Duration,
    client: std::marker::PhantomData<fn() -> C>,
}

impl<C: FromChannel> Leader<C> {
    pub fn new(endpoints: Vec<String>) -> Result<Leader<C>> {
        if endpoints.is_empty() {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoints".into(),
            });
        }
        for ep in &endpoints {
            Endpoint::from_shared(ep.clone()).map_err(|e| Error::InvalidEndpoint {
                endpoint: ep.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(Leader {
            endpoints: Mutex::new(endpoints),
            at: AtomicUsize::new(0),
            deadline: Duration::from_secs(15),
            request_timeout: Duration::from_secs(10),
            client: std::marker::PhantomData,
        })
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints.lock().expect("lock poisoned").clone()
    }

    fn client(endpoint: &str) -> Result<C> {
        let ch = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| Error::InvalidEndpoint {
                endpoint: endpoint.to_string(),
                reason: e.to_string(),
            })?
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy();
        Ok(C::from_channel(ch))
    }

    /// Calls the leader. A typed refusal (bad argument, unknown tablet or
    /// namespace) returns at once; `NotLeader`, `Unavailable` and unreachable
    /// controllers are retried on the others until `deadline`.
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let mut attempts = 0u32;
        loop {
            let endpoints = self.endpoints();
            let i = self.at.load(Ordering::Relaxed) % endpoints.len();
            let ep = endpoints[i].clone();
            attempts += 1;
            let result = tokio::time::timeout(self.request_timeout, f(Self::client(&ep)?)).await;
            let err: Error = match result {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(status)) => status.into(),
                Err(_) => Error::RequestTimeout {
                    endpoint: ep.clone(),
                    elapsed: self.request_timeout,
                },
            };
            let next = match err.api() {
                Some(stele_proto::Error::NotLeader {
                    leader_endpoint, ..
                }) if !leader_endpoint.is_empty() => {
                    let mut list = self.endpoints.lock().expect("lock poisoned");
                    match list.iter().position(|e| e == leader_endpoint) {
                        Some(j) => j,
                        None => {
                            list.push(leader_endpoint.clone());
                            list.len() - 1
                        }
                    }
                }
                Some(stele_proto::Error::NotLeader { .. })
                | Some(stele_proto::Error::Unavailable { .. })
                | None => (i + 1) % endpoints.len(),
                Some(_) => return Err(err),
            };
            self.at.store(next, Ordering::Relaxed);
            if started.elapsed() > self.deadline {
                return Err(Error::Exhausted {
                    attempts,
                    elapsed: started.elapsed(),
                    last: Box::new(err),
                });
            }
            // A full round without an answer: an election is likely under way.
            if next <= i {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
