//! A directory quorum of real processes on loopback
//! (`stele server --roles directory`), plaintext or TLS. With TLS each
//! member has its own certificate (`directory-<id>.stele`, in
//! `certs-dir<id>`) from the test CA, and the CLI calls it as the test
//! operator.

use std::path::PathBuf;

use crate::{Proc, free_port_base, make_certs, run};

pub struct Directory {
    pub tmp: tempfile::TempDir,
    pub members: usize,
    base: u16,
    tls: bool,
}

impl Directory {
    /// `members` members; with `tls`, their certificates are issued now.
    pub fn new(members: usize, tls: bool) -> Directory {
        let tmp = tempfile::tempdir().unwrap();
        if tls {
            make_certs(tmp.path(), 0);
            for i in 1..=members {
                let (ok, _, err) = run(&[
                    "cert",
                    "issue",
                    "--ca",
                    tmp.path().join("ca").to_str().unwrap(),
                    "--directory-id",
                    &i.to_string(),
                    "--out",
                    tmp.path().join(format!("certs-dir{i}")).to_str().unwrap(),
                ]);
                assert!(ok, "directory {i} certificate: {err}");
            }
        }
        Directory {
            tmp,
            members,
            base: free_port_base(members as u16),
            tls,
        }
    }

    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.base + i as u16 - 1)
    }

    pub fn endpoints(&self) -> Vec<String> {
        (1..=self.members).map(|i| self.endpoint(i)).collect()
    }

    /// The members as the CLI's `--directory` takes them.
    pub fn arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// Member `i`'s certificate directory (TLS).
    pub fn certs(&self, i: usize) -> PathBuf {
        self.tmp.path().join(format!("certs-dir{i}"))
    }

    pub fn start(&self, i: usize) -> Proc {
        self.start_with(i, &[])
    }

    /// [`Directory::start`] with `extra` flags for this member alone
    /// (`--http-listen`, ...).
    pub fn start_with(&self, i: usize, extra: &[&str]) -> Proc {
        let listen = format!("127.0.0.1:{}", self.base + i as u16 - 1);
        let data = self.tmp.path().join(format!("dir{i}"));
        let mut args = vec![
            "server".to_string(),
            "--roles".into(),
            "directory".into(),
            "--directory-id".into(),
            i.to_string(),
            "--listen".into(),
            listen,
            "--data-dir".into(),
            data.to_str().unwrap().into(),
        ];
        if self.tls {
            args.extend(["--certs".into(), self.certs(i).to_str().unwrap().into()]);
        }
        args.extend(extra.iter().map(|f| f.to_string()));
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        Proc::start(&a, &[]).unwrap_or_else(|e| panic!("directory {i}: {e}"))
    }

    /// `stele <args> --directory ... --json`, parsed; panics on failure.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let (ok, out, err) = self.cli(args);
        assert!(ok, "{args:?}: {out}{err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
    }

    /// `stele <args> --directory ... --json`, as the test operator.
    pub fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let d = self.arg();
        let mut a = args.to_vec();
        a.extend(["--directory", &d, "--json"]);
        run(&a)
    }

    /// The refusal's message; panics if the command succeeded.
    pub fn refused(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.cli(args);
        assert!(!ok, "{args:?} was accepted: {out}");
        err
    }
}
