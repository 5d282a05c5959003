//! `stele token`: namespace tokens for clients of the data API (issue,
//! revoke, list through the controllers; inspect locally).
//!
//! A token is a secret: `issue` prints it alone on stdout, once (the cell
//! keeps only its id), and clients take it from `STELE_TOKEN` or
//! `--token-file`, never from the command line.

use std::time::{Duration, UNIX_EPOCH};

use clap::Subcommand;
use serde_json::json;
use stele_proto::pb;

use super::controllers::{Target, admin};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Sign a token (needs an operator certificate). The token goes to
    /// stdout, alone; what it grants to stderr.
    Issue {
        /// What it may touch, comma-separated: `workspace/project`,
        /// `workspace/*` or `*`.
        #[arg(long, value_delimiter = ',', required = true)]
        namespaces: Vec<String>,
        /// `append`, `read`, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        rights: Vec<String>,
        /// How long it lives (`30d`, `12h`, `90m`; at most ten years).
        #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = super::duration::parse_duration)]
        expires: Duration,
        /// Who it is for, as `stele token list` shows it.
        #[arg(long, default_value = "client")]
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Revoke a token by id: every node refuses it from its next
    /// heartbeat answer on (a second or two).
    Revoke {
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Tokens not yet expired, revoked ones included.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// What the CLI's token (`STELE_TOKEN` or `--token-file`) says, without
    /// checking its signature.
    Inspect,
}

fn when(unix_s: u64) -> String {
    if unix_s == 0 {
        return "-".into();
    }
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(unix_s)).to_string()
}

fn info_json(i: &pb::TokenInfo) -> serde_json::Value {
    json!({
        "id": i.id, "name": i.name, "namespaces": i.namespaces, "rights": i.rights,
        "issued_at": i.issued_at, "expires_at": i.expires_at,
        "revoked_at": (i.revoked_at != 0).then_some(i.revoked_at),
    })
}

/// Tokens as a table: id, name, rights, namespaces, expiry, revocation.
fn print_infos(infos: &[pb::TokenInfo]) {
    let mut t = super::table::new(
        &["id", "name", "rights", "namespaces", "expires", "revoked"],
        &[],
    );
    for i in infos {
        t.add_row(vec![
            i.id.clone(),
            i.name.clone(),
            i.rights.join(","),
            i.namespaces.join(","),
            when(i.expires_at),
            when(i.revoked_at),
        ]);
    }
    super::table::print(&t);
}

pub async fn run(cmd: TokenCommand) -> anyhow::Result<()> {
    match cmd {
        TokenCommand::Issue {
            namespaces,
            rights,
            expires,
            name,
            target,
        } => {
            let req = pb::IssueTokenRequest {
                name,
                namespaces,
                rights,
                ttl_s: expires.as_secs(),
            };
            let resp = admin(&target)?
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.issue_token(req).await }
                })
                .await?;
            let info = resp.info.unwrap_or_default();
            if target.json {
                let mut v = info_json(&info);
                v["token"] = json!(resp.token);
                println!("{v}");
            } else {
                println!("{}", resp.token);
                eprintln!(
                    "token {} for {:?}: {} on {}, expires {}",
                    info.id,
                    info.name,
                    info.rights.join(","),
                    info.namespaces.join(","),
                    when(info.expires_at)
                );
            }
            Ok(())
        }
        TokenCommand::Revoke { id, target } => {
            let req = pb::RevokeTokenRequest { id };
            let info = admin(&target)?
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.revoke_token(req).await }
                })
                .await?;
            if target.json {
                println!("{}", info_json(&info));
            } else {
                print_infos(std::slice::from_ref(&info));
            }
            Ok(())
        }
        TokenCommand::List { target } => {
            let resp = admin(&target)?
                .call(|mut c| async move { c.list_tokens(pb::ListTokensRequest {}).await })
                .await?;
            if target.json {
                let all: Vec<_> = resp.tokens.iter().map(info_json).collect();
                println!("{}", json!(all));
            } else {
                print_infos(&resp.tokens);
            }
            Ok(())
        }
        TokenCommand::Inspect => {
            let token = crate::security::cli_token_text()?
                .ok_or_else(|| anyhow::anyhow!("no token: set STELE_TOKEN or --token-file"))?;
            let (claims, _, _) = stele_tls::token::decode(&token)?;
            println!("{}", serde_json::to_string_pretty(&claims)?);
            Ok(())
        }
    }
}
