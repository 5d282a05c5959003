//! Each node in its own network namespace behind a bridge the runner
//! creates, and faults made with nftables inside those namespaces:
//! partitions (drop traffic to and from chosen peers) and packet loss.
//!
//! ```text
//! root namespace: bridge sj<S>br 10.77.<S>.1/24   (the runner, its clients, the controller)
//!   veth sj<S>r<i> ── sj<S>n<i> in netns stele-j<S>-n<i>, 10.77.<S>.<10+i>/24
//!   each namespace: table inet stele { chain input, chain output }   (the faults' rules)
//! ```
//!
//! Needs root, `ip` (iproute2) and `nft` (nftables). [`Netns::available`]
//! says whether this machine has them; the runner falls back to loopback
//! and the transport peer filter when it does not, and says so.

use std::process::{Command, Stdio};

use anyhow::Context;

pub struct Netns {
    subnet: u8,
    nodes: usize,
    created: bool,
}

fn sh(cmd: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {cmd}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Runs `nft -f -` inside `ns` with `script` on stdin.
fn nft(ns: &str, script: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("run nft")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "nft in {ns}: {}\n{script}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl Netns {
    /// True when namespaces, veth, a bridge and nftables can be used here.
    pub fn available() -> bool {
        let root = unsafe_geteuid() == 0;
        let tools = ["ip", "nft"].iter().all(|t| {
            Command::new(t)
                .arg("-V")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if !(root && tools) {
            return false;
        }
        let probe = format!("stele-probe-{}", std::process::id());
        let ok = sh("ip", &["netns", "add", &probe]).is_ok()
            && nft(
                &probe,
                "table inet stele {\n chain input { type filter hook input priority 0; }\n}\n",
            )
            .is_ok();
        let _ = sh("ip", &["netns", "del", &probe]);
        ok
    }

    /// Creates the bridge and one namespace per node, on a subnet picked
    /// from `seed` that no interface on this machine uses yet.
    pub fn create(nodes: usize, seed: u64) -> anyhow::Result<Netns> {
        let used = String::from_utf8_lossy(
            &Command::new("ip")
                .args(["-o", "-4", "addr"])
                .output()
                .context("ip addr")?
                .stdout,
        )
        .into_owned();
        let mut subnet = None;
        for attempt in 0..250u64 {
            let s = 1
                + ((seed ^ u64::from(std::process::id()) ^ attempt)
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    >> 56) as u8
                    % 250;
            if !used.contains(&format!("10.77.{s}.")) {
                subnet = Some(s);
                break;
            }
        }
        let mut n = Netns {
            subnet: subnet.context("no free 10.77.x.0/24 subnet")?,
            nodes,
            created: true,
        };
        n.destroy(); // leftovers of an earlier run on the same subnet
        n.created = true;
        let br = n.bridge();
        sh("ip", &["link", "add", &br, "type", "bridge"])?;
        sh(
            "ip",
            &["addr", "add", &format!("{}/24", n.gateway()), "dev", &br],
        )?;
        sh("ip", &["link", "set", &br, "up"])?;
        n.accept_forwarding();
        for i in 1..=nodes {
            let (ns, root_end, ns_end) = (n.ns(i), n.veth_root(i), n.veth_ns(i));
            sh("ip", &["netns", "add", &ns])?;
            sh(
                "ip",
                &[
                    "link", "add", &root_end, "type", "veth", "peer", "name", &ns_end,
                ],
            )?;
            sh("ip", &["link", "set", &ns_end, "netns", &ns])?;
            sh("ip", &["link", "set", &root_end, "master", &br])?;
            sh("ip", &["link", "set", &root_end, "up"])?;
            sh(
                "ip",
                &[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/24", n.ip(i)),
                    "dev",
                    &ns_end,
                ],
            )?;
            sh("ip", &["-n", &ns, "link", "set", &ns_end, "up"])?;
            sh("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            sh(
                "ip",
                &["-n", &ns, "route", "add", "default", "via", &n.gateway()],
            )?;
            nft(
                &ns,
                "table inet stele {\n\
                 chain input { type filter hook input priority 0; }\n\
                 chain output { type filter hook output priority 0; }\n}",
            )?;
        }
        Ok(n)
    }

    /// Bridged frames pass the root namespace's iptables FORWARD chain
    /// (br_netfilter), whose policy the Docker daemon sets to DROP: without
    /// an explicit accept, nodes on our bridge cannot reach each other and
    /// the run ends with "did not come up". The rule names only our bridge
    /// and is removed with it. A machine without iptables has no such
    /// policy to get past.
    fn accept_forwarding(&self) {
        // Without iptables there is no such policy to get past; a run that
        // still cannot connect fails loudly at "did not come up".
        let _ = self.forward_rule("-I");
    }

    fn drop_forwarding(&self) {
        // Every copy: an earlier run on this subnet may have left one.
        while self.forward_rule("-D").is_ok() {}
    }

    /// Inserts (`-I`) or deletes (`-D`) the FORWARD accept for our bridge.
    fn forward_rule(&self, op: &str) -> anyhow::Result<()> {
        let br = self.bridge();
        sh(
            "iptables",
            &[op, "FORWARD", "-i", &br, "-o", &br, "-j", "ACCEPT"],
        )
    }

    fn bridge(&self) -> String {
        format!("sj{}br", self.subnet)
    }

    fn veth_root(&self, i: usize) -> String {
        format!("sj{}r{i}", self.subnet)
    }

    fn veth_ns(&self, i: usize) -> String {
        format!("sj{}n{i}", self.subnet)
    }

    /// The namespace of node `i`.
    pub fn ns(&self, i: usize) -> String {
        format!("stele-j{}-n{i}", self.subnet)
    }

    /// Node `i`'s address.
    pub fn ip(&self, i: usize) -> String {
        format!("10.77.{}.{}", self.subnet, 10 + i)
    }

    /// The root namespace's address on the bridge (runner, controller).
    pub fn gateway(&self) -> String {
        format!("10.77.{}.1", self.subnet)
    }

    /// Makes node `i` drop every packet to and from `peers` (the rules
    /// replace the node's earlier ones).
    pub fn block(&self, i: usize, peers: &[usize]) -> anyhow::Result<()> {
        let mut script = String::from("flush table inet stele\n");
        if !peers.is_empty() {
            let set: Vec<String> = peers.iter().map(|p| self.ip(*p)).collect();
            let set = set.join(", ");
            script.push_str(&format!(
                "add rule inet stele input ip saddr {{ {set} }} drop\n\
                 add rule inet stele output ip daddr {{ {set} }} drop\n"
            ));
        }
        nft(&self.ns(i), &script)
    }

    /// Drops `percent` of node `i`'s packets, both directions (on top of
    /// its partition rules).
    pub fn loss(&self, i: usize, percent: u32) -> anyhow::Result<()> {
        nft(
            &self.ns(i),
            &format!(
                "add rule inet stele input numgen random mod 100 < {percent} drop\n\
                 add rule inet stele output numgen random mod 100 < {percent} drop\n"
            ),
        )
    }

    /// Removes every fault rule.
    pub fn heal(&self) -> anyhow::Result<()> {
        for i in 1..=self.nodes {
            nft(&self.ns(i), "flush table inet stele\n")?;
        }
        Ok(())
    }

    /// `ip netns exec <ns>` prefix for node `i`'s command.
    pub fn command(&self, i: usize, bin: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(i)]).arg(bin);
        c
    }

    fn destroy(&mut self) {
        if !self.created {
            return;
        }
        for i in 1..=self.nodes {
            let _ = sh("ip", &["netns", "del", &self.ns(i)]);
            let _ = sh("ip", &["link", "del", &self.veth_root(i)]);
        }
        let _ = sh("ip", &["link", "del", &self.bridge()]);
        self.drop_forwarding();
        self.created = false;
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.destroy();
    }
}

#[allow(unsafe_code)]
fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}
