//! The file -> flag mapping without processes: `check` loads a file
//! against a small command and compares the parse or the error.

use std::ffi::OsString;

use clap::{Arg, ArgAction, Command};

use super::*;

/// A command shaped like `stele server`: scalars, a list, a flag, a ranged
/// number, a required address and a secret.
fn command() -> Command {
    prepare(
        Command::new(SERVER)
            .arg(
                Arg::new("heartbeat_ms")
                    .long("heartbeat-ms")
                    .value_parser(clap::value_parser!(u64))
                    .default_value("1000"),
            )
            .arg(
                Arg::new("merge_below_percent")
                    .long("merge-below-percent")
                    .value_parser(clap::value_parser!(u64).range(0..=50))
                    .default_value("0"),
            )
            .arg(
                Arg::new("controllers")
                    .long("controllers")
                    .value_delimiter(',')
                    .action(ArgAction::Append),
            )
            .arg(
                Arg::new("auto_create_namespaces")
                    .long("auto-create-namespaces")
                    .action(ArgAction::SetTrue),
            )
            .arg(
                Arg::new("listen")
                    .long("listen")
                    .value_parser(clap::value_parser!(std::net::SocketAddr))
                    .required(true),
            )
            .arg(Arg::new("s3_secret_access_key").long("s3-secret-access-key")),
    )
}

/// Loads `toml` as a file and parses `argv` with its settings applied:
/// the matches as `key=values` lines, or the error's text.
fn check(toml: &str, argv: &[&str], expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stele.toml");
    std::fs::write(&file, toml).unwrap();
    let got = match load(&command(), &file) {
        Err(e) => e.to_string().replace(&file.display().to_string(), "FILE"),
        Ok(settings) => {
            let argv: Vec<OsString> = std::iter::once(SERVER)
                .chain(argv.iter().copied())
                .map(OsString::from)
                .collect();
            match apply(command(), &settings).try_get_matches_from(argv) {
                Err(e) => e.kind().to_string(),
                Ok(m) => [
                    "heartbeat_ms",
                    "merge_below_percent",
                    "controllers",
                    "auto_create_namespaces",
                    "listen",
                ]
                .iter()
                .map(|id| {
                    let vals: Vec<String> = m
                        .get_raw(id)
                        .into_iter()
                        .flatten()
                        .map(|v| v.to_string_lossy().into_owned())
                        .collect();
                    format!("{id}={}", vals.join(","))
                })
                .collect::<Vec<_>>()
                .join(" "),
            }
        }
    };
    assert_eq!(got, expected, "file:\n{toml}");
}

#[test]
fn file_values_are_defaults_below_the_command_line() {
    check(
        "listen = \"127.0.0.1:1\"\nheartbeat_ms = 250\ncontrollers = [\"http://a\", \"http://b\"]\nauto_create_namespaces = true\n",
        &[],
        "heartbeat_ms=250 merge_below_percent=0 controllers=http://a,http://b auto_create_namespaces=true listen=127.0.0.1:1",
    );
    check(
        "listen = \"127.0.0.1:1\"\nheartbeat_ms = 250\ncontrollers = [\"http://a\"]\n",
        &[
            "--heartbeat-ms",
            "7",
            "--controllers",
            "http://c",
            "--listen",
            "127.0.0.1:2",
        ],
        "heartbeat_ms=7 merge_below_percent=0 controllers=http://c auto_create_namespaces=false listen=127.0.0.1:2",
    );
    // Numbers may be written as strings; one value for a list is a list of one.
    check(
        "listen = \"127.0.0.1:1\"\nheartbeat_ms = \"9\"\ncontrollers = \"http://a\"\n",
        &[],
        "heartbeat_ms=9 merge_below_percent=0 controllers=http://a auto_create_namespaces=false listen=127.0.0.1:1",
    );
    // A required flag not in the file is still required.
    check(
        "heartbeat_ms = 5\n",
        &[],
        "one or more required arguments were not provided",
    );
}

#[test]
fn bad_files_are_refused_naming_the_key() {
    check(
        "heartbeat_ms = \"x\"\n",
        &[],
        "config file FILE: key heartbeat_ms: invalid value \"x\": invalid digit found in string",
    );
    check(
        "merge_below_percent = 51\n",
        &[],
        "config file FILE: key merge_below_percent: invalid value \"51\": 51 is not in 0..=50",
    );
    check(
        "heartbeat_ms = 1.5\n",
        &[],
        "config file FILE: key heartbeat_ms: want a string or an integer, got a float",
    );
    check(
        "heartbeat_ms = [1, 2]\n",
        &[],
        "config file FILE: key heartbeat_ms: want one value, got a list",
    );
    check(
        "controllers = []\n",
        &[],
        "config file FILE: key controllers: an empty list: leave the key out instead",
    );
    check(
        "auto_create_namespaces = \"yes\"\n",
        &[],
        "config file FILE: key auto_create_namespaces: want true or false (a TOML boolean), got a string",
    );
    check(
        "listen = \"0.0.0.0\"\n",
        &[],
        "config file FILE: key listen: invalid value \"0.0.0.0\": invalid socket address syntax",
    );
    check(
        "heartbeat_msec = 5\n",
        &[],
        "config file FILE: unknown key \"heartbeat_msec\" (did you mean heartbeat_ms?)",
    );
    check(
        "heartbeat-ms = 5\n",
        &[],
        "config file FILE: unknown key \"heartbeat-ms\" (did you mean heartbeat_ms?)",
    );
    check("zzz = 5\n", &[], "config file FILE: unknown key \"zzz\"");
    check(
        "[server]\nlisten = \"127.0.0.1:1\"\n",
        &[],
        "config file FILE: unknown key \"server\"",
    );
    check(
        "config = \"other.toml\"\n",
        &[],
        "config file FILE: key config: a config file does not name another",
    );
    check(
        "heartbeat_ms = \n",
        &[],
        "config file FILE: not valid TOML: TOML parse error at line 1, column 16\n  |\n1 | heartbeat_ms = \n  |                ^\nstring values must be quoted, expected literal string",
    );
}

#[test]
fn a_secret_in_the_file_is_refused_without_its_value() {
    check(
        "s3_secret_access_key = \"hunter2-secret\"\n",
        &[],
        "config file FILE: key s3_secret_access_key is a secret and is not read from a config file: set STELE_S3_SECRET_ACCESS_KEY, or s3_secret_access_key_file to a file holding it",
    );
}

#[test]
fn every_flag_gets_an_environment_variable() {
    let cmd = command();
    let mut envs: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_env().unwrap().to_string_lossy().into_owned())
        .collect();
    envs.sort();
    assert_eq!(
        envs,
        [
            "STELE_AUTO_CREATE_NAMESPACES",
            "STELE_CONFIG",
            "STELE_CONTROLLERS",
            "STELE_HEARTBEAT_MS",
            "STELE_LISTEN",
            "STELE_MERGE_BELOW_PERCENT",
            "STELE_S3_SECRET_ACCESS_KEY",
        ]
    );
}

#[test]
fn secrets_come_from_a_file_trimmed_or_the_environment_never_both() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("key");
    std::fs::write(&f, "s3cr3t\n").unwrap();
    assert_eq!(
        secret("k", None, Some(&f)).unwrap().as_deref(),
        Some("s3cr3t")
    );
    assert_eq!(secret("k", Some("e"), None).unwrap().as_deref(), Some("e"));
    assert_eq!(secret("k", None, None).unwrap(), None);
    assert_eq!(
        secret("k", Some("e"), Some(&f)).unwrap_err().to_string(),
        "k: set either STELE_K or k_file, not both"
    );
    std::fs::write(&f, "\n").unwrap();
    let e = secret("k", None, Some(&f)).unwrap_err().to_string();
    assert!(e.ends_with(": empty"), "{e}");
}
