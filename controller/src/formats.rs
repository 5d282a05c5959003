//! The format gate (`stele cell formats enable NAME VERSION`).
//!
//! ```text
//! behind(state, builds, controllers, name, version)     pure
//!   every node not decommissioned, and every controller, must report
//!   `name` at `version` or newer; a node not heard from since this
//!   controller took the lead, or a controller that does not answer,
//!   counts as behind ─▶ the members behind, with what they run
//! enable(controller, request)                          I/O
//!   validate, ask every other controller for its build (CellStatus,
//!   local), refuse with the members behind (FailedPrecondition, nothing
//!   changed), else propose EnableFormat
//! ```
//!
//! Once enabled, heartbeat answers carry the cell's formats (node leaders
//! write them from then on) and a node whose binary reports less is
//! refused at its heartbeat, naming the format: downgrading a node below a
//! format the cell uses is not supported.

use std::collections::HashMap;
use std::time::Duration;

use stele_proto::formats::{self, describe, version_of};
use stele_proto::pb;
use stele_quorum::refuse;
use tonic::Status;

use crate::health::Build;
use crate::server::Controller;
use crate::state::{Admin, CellState, Command, Reply};

/// How long a peer controller has to report its build.
const PEER_TIMEOUT: Duration = Duration::from_secs(3);

/// The members that do not read and write `name` at `version`, each with
/// what it runs. `controllers` is each other controller's build, or why it
/// could not be asked.
pub fn behind(
    state: &CellState,
    builds: &HashMap<u64, Build>,
    controllers: &[(u64, Result<Build, String>)],
    name: &str,
    version: u32,
) -> Vec<String> {
    let mut out = Vec::new();
    for (id, build) in controllers {
        match build {
            Err(e) => out.push(format!("controller {id} did not report its build: {e}")),
            Ok(b) if version_of(&b.formats, name) < version => out.push(format!(
                "controller {id} runs {} ({})",
                b.version,
                describe(&b.formats)
            )),
            Ok(_) => {}
        }
    }
    for n in state
        .nodes
        .values()
        .filter(|n| n.admin != Admin::Decommissioned)
    {
        match builds.get(&n.id) {
            None => out.push(format!(
                "node {} has not reported its build to this controller (down? decommission it if it is gone)",
                n.id
            )),
            Some(b) if version_of(&b.formats, name) < version => out.push(format!(
                "node {} runs {} ({})",
                n.id,
                b.version,
                describe(&b.formats)
            )),
            Some(_) => {}
        }
    }
    out
}

/// Why a node running `build` may not take part in a cell using `state`'s
/// formats, if it may not.
pub fn refuse_node(state: &CellState, build: &Build) -> Option<String> {
    state
        .formats
        .iter()
        .find(|(name, v)| version_of(&build.formats, name) < **v)
        .map(|(name, v)| {
            format!(
                "the cell uses {name} format {v}, and this node's binary ({}) reads and writes {name} up to {}: run a binary that supports it",
                build.version,
                version_of(&build.formats, name)
            )
        })
}

/// Records the build a heartbeat reports, and refuses the heartbeat
/// (FailedPrecondition, nothing else recorded) of a node whose binary does
/// not support a format the cell uses.
pub fn admit(c: &Controller, reg: &pb::NodeRegistration) -> Result<(), Status> {
    let build = Build {
        version: reg.version.clone(),
        formats: reg.formats.clone(),
    };
    let refused = refuse_node(&c.quorum.state(), &build);
    c.health().builds.insert(reg.id, build);
    match refused {
        Some(why) => {
            tracing::warn!(node = reg.id, %why, "heartbeat refused");
            Err(Status::failed_precondition(why))
        }
        None => Ok(()),
    }
}

/// This process's build.
pub fn own_build() -> Build {
    Build {
        version: formats::binary_version().into(),
        formats: formats::supported_pb(),
    }
}

async fn peer_build(endpoint: &str, tls: Option<&stele_tls::ClientTls>) -> Result<Build, String> {
    let ask = async {
        let channel = stele_tls::channel(endpoint, tls, stele_tls::Kind::Controller, PEER_TIMEOUT)
            .map_err(|e| e.to_string())?;
        let status = pb::controller_client::ControllerClient::new(channel)
            .cell_status(pb::CellStatusRequest { local: true })
            .await
            .map_err(|e| format!("{endpoint}: {}", e.message()))?
            .into_inner();
        Ok(Build {
            version: status.controller_version,
            formats: status.controller_formats,
        })
    };
    tokio::time::timeout(PEER_TIMEOUT * 2, ask)
        .await
        .map_err(|_| format!("{endpoint}: no answer in {:?}", PEER_TIMEOUT * 2))?
}

/// Turns `name` up to `version` for the cell, once every member reads
/// and writes it (FailedPrecondition naming the members behind, nothing
/// changed, otherwise). The caller is the leader.
pub async fn raise(c: &Controller, name: &str, version: u32) -> Result<(), Status> {
    let state = c.snapshot();
    let mut controllers = Vec::new();
    for (id, endpoint) in c.quorum.members() {
        if id != c.opts.id {
            controllers.push((id, peer_build(&endpoint, c.opts.tls.as_ref()).await));
        }
    }
    let builds = c.health().builds.clone();
    let behind = behind(&state, &builds, &controllers, name, version);
    if !behind.is_empty() {
        return Err(Status::failed_precondition(format!(
            "{name} format {version} not enabled: not every member reads and writes it: {}",
            behind.join("; ")
        )));
    }
    match c
        .propose(Command::EnableFormat {
            name: name.into(),
            version,
        })
        .await?
    {
        Reply::Refused(r) => return Err(Status::failed_precondition(r)),
        Reply::Ok | Reply::Intent(_) => {}
    }
    tracing::info!(format = name, version, "format enabled for the cell");
    Ok(())
}

/// Handles `EnableFormat`.
pub async fn enable(
    c: &Controller,
    request: tonic::Request<pb::EnableFormatRequest>,
) -> Result<tonic::Response<pb::EnableFormatResponse>, Status> {
    let req = request.into_inner();
    let known = formats::SUPPORTED
        .iter()
        .map(|(n, v)| format!("{n} 1..={v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(max) = formats::supported(&req.name) else {
        return Err(refuse(
            "name",
            format!(
                "no gated format {:?}; this controller knows {known}",
                req.name
            ),
        ));
    };
    if req.version < formats::BASELINE || req.version > max {
        return Err(refuse(
            "version",
            format!(
                "{} {} is not a version this controller knows ({known})",
                req.name, req.version
            ),
        ));
    }
    c.require_leader()?;
    let state = c.snapshot();
    let current = state.format(&req.name);
    if req.version < current {
        return Err(Status::failed_precondition(format!(
            "the cell uses {} format {current}; a format never goes back",
            req.name
        )));
    }
    if req.version > current {
        raise(c, &req.name, req.version).await?;
    }
    Ok(tonic::Response::new(pb::EnableFormatResponse {
        formats: formats::to_pb(&c.snapshot().formats),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::NodeRec;

    fn node(id: u64, admin: Admin) -> NodeRec {
        NodeRec {
            id,
            client_endpoint: format!("http://n{id}:7450"),
            peer_endpoint: format!("n{id}:7550"),
            zone: String::new(),
            rack: String::new(),
            capacity: 1,
            admin,
            dead: false,
        }
    }

    fn build(version: &str, segment: Option<u32>) -> Build {
        Build {
            version: version.into(),
            formats: segment
                .map(|v| {
                    vec![pb::FormatVersion {
                        name: formats::SEGMENT.into(),
                        version: v,
                    }]
                })
                .unwrap_or_default(),
        }
    }

    #[test]
    fn every_member_must_support_the_version() {
        let mut s = CellState::new();
        for (id, admin) in [
            (1, Admin::Active),
            (2, Admin::Draining),
            (3, Admin::Active),
            (4, Admin::Decommissioned),
        ] {
            s.nodes.insert(id, node(id, admin));
        }
        let mut builds = HashMap::new();
        builds.insert(1, build("new", Some(2)));
        builds.insert(2, build("old", None));
        let ctl = vec![
            (2, Ok(build("new", Some(2)))),
            (3, Err("unreachable".to_string())),
        ];
        let out = behind(&s, &builds, &ctl, formats::SEGMENT, 2);
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(out[0].starts_with("controller 3 did not report"), "{out:?}");
        assert!(out[1].starts_with("node 2 runs old"), "{out:?}");
        assert!(out[2].starts_with("node 3 has not reported"), "{out:?}");
        // Version 1 is what everyone reads: nobody is behind but the
        // silent ones.
        assert_eq!(behind(&s, &builds, &ctl, formats::SEGMENT, 1).len(), 2);
        builds.insert(2, build("new", Some(2)));
        builds.insert(3, build("new", Some(2)));
        let ctl = vec![(2, Ok(build("new", Some(2))))];
        assert!(behind(&s, &builds, &ctl, formats::SEGMENT, 2).is_empty());
    }

    #[test]
    fn a_node_behind_the_cell_is_refused() {
        let mut s = CellState::new();
        assert_eq!(refuse_node(&s, &build("old", None)), None);
        assert_eq!(
            s.apply(Command::EnableFormat {
                name: formats::SEGMENT.into(),
                version: 2
            }),
            Reply::Ok
        );
        let why = refuse_node(&s, &build("old", None)).unwrap();
        assert!(why.contains("segment format 2"), "{why}");
        assert_eq!(refuse_node(&s, &build("new", Some(2))), None);
        // Never back down.
        assert!(matches!(
            s.apply(Command::EnableFormat {
                name: formats::SEGMENT.into(),
                version: 1
            }),
            Reply::Refused(_)
        ));
        assert_eq!(s.format(formats::SEGMENT), 2);
    }
}
