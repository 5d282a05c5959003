//! `stele server` settings from three places, all derived from the clap
//! definition of the command, so a flag added later has a config key and
//! an environment variable without any change here.
//!
//! ```text
//! --heartbeat-ms 500          command line        wins over
//! STELE_HEARTBEAT_MS=500      environment         wins over
//! heartbeat_ms = 500          the --config file   wins over
//! the flag's default
//! ```
//!
//! A flag's key is its long name with `-` written `_`; its environment
//! variable is `STELE_` and the key in upper case ([`prepare`] adds them by
//! walking the command's arguments). The file's values become the flags'
//! defaults ([`apply`]); clap already ranks the command line over the
//! environment over defaults. Each file value first goes through the flag's
//! own value parser ([`load`]), so a bad value is refused naming the key and
//! the file, and an unknown key names the nearest known one.
//!
//! Secrets ([`SECRETS`]) are never taken from argv (the command line shows
//! in `ps`, `/proc/PID/cmdline` and shell history) nor written in the file:
//! they come from their environment variable or from a file named by
//! `<key>_file` ([`secret`]), and no error message repeats them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// The subcommand whose flags have keys and environment variables.
pub const SERVER: &str = "server";
/// Prefix of every setting's environment variable.
pub const ENV_PREFIX: &str = "STELE_";
/// The flag naming the file (`--config`, `STELE_CONFIG`); not a key itself.
pub const CONFIG_ID: &str = "config";
/// Settings that are secrets: from their environment variable or
/// `<key>_file` only.
pub const SECRETS: &[&str] = &["s3_access_key_id", "s3_secret_access_key"];

/// Example values `stele config default` prints for the required keys (a
/// required key has no default to print). A required flag added without
/// one here makes the `config default | config check` test fail.
const EXAMPLES: &[(&str, &str)] = &[("listen", "127.0.0.1:7450"), ("data_dir", "/var/lib/stele")];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("config file {file}")]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {file}: not valid TOML: {message}")]
    Toml { file: PathBuf, message: String },
    #[error("config file {file}: unknown key {key:?}{}", suggest(.suggestion))]
    UnknownKey {
        file: PathBuf,
        key: String,
        suggestion: Option<String>,
    },
    #[error("config file {file}: key {key}: {reason}")]
    BadValue {
        file: PathBuf,
        key: String,
        reason: String,
    },
    #[error(
        "config file {file}: key {key} is a secret and is not read from a config file: set {env}, or {key}_file to a file holding it"
    )]
    SecretInFile {
        file: PathBuf,
        key: String,
        env: String,
    },
    #[error(
        "--{flag} is a secret and is not taken on the command line (it would show in ps and shell history): set {env}, or {key}_file (--{flag}-file) to a file holding it"
    )]
    SecretFlag {
        flag: String,
        key: String,
        env: String,
    },
    #[error("{key}: set either {env} or {key}_file, not both")]
    SecretTwice { key: String, env: String },
    #[error("{key}_file {file}: {reason}")]
    SecretFile {
        key: String,
        file: PathBuf,
        reason: String,
    },
}

fn suggest(s: &Option<String>) -> String {
    match s {
        Some(k) => format!(" (did you mean {k}?)"),
        None => String::new(),
    }
}

/// The config key of a flag: its long name with `-` written `_`.
pub fn key_of(arg: &Arg) -> Option<String> {
    arg.get_long().map(|l| l.replace('-', "_"))
}

/// The environment variable of a key.
pub fn env_of(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.to_uppercase())
}

fn is_flag(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse)
}

fn is_list(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append) || arg.get_value_delimiter().is_some()
}

/// Gives every flag of `cmd` that has none its `STELE_…` environment
/// variable, and adds `--config`.
pub fn prepare(cmd: Command) -> Command {
    let envs: Vec<(String, String)> = cmd
        .get_arguments()
        .filter(|a| a.get_env().is_none())
        .filter_map(|a| Some((a.get_id().to_string(), env_of(&key_of(a)?))))
        .collect();
    let mut cmd = cmd.arg(
        Arg::new(CONFIG_ID)
            .long("config")
            .env(env_of(CONFIG_ID))
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .help(
                "TOML file of settings: a key per flag (`heartbeat_ms = 500`); \
                 flags beat STELE_* environment variables beat the file \
                 (see `stele config default`)",
            ),
    );
    for (id, env) in envs {
        cmd = cmd.mut_arg(id, |a| a.env(env));
    }
    cmd
}

/// One key of a file, as the default values of its flag.
pub struct Setting {
    id: String,
    values: Vec<OsString>,
}

/// Reads `file` and checks every key and value against the flags of `cmd`
/// (a [`prepare`]d command): unknown keys, secrets, values of the wrong
/// TOML type and values the flag's own parser refuses are errors naming
/// the key.
pub fn load(cmd: &Command, file: &Path) -> Result<Vec<Setting>, Error> {
    let text = std::fs::read_to_string(file).map_err(|source| Error::Read {
        file: file.to_path_buf(),
        source,
    })?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Toml {
        file: file.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    })?;
    let bad = |key: &str, reason: String| Error::BadValue {
        file: file.to_path_buf(),
        key: key.to_string(),
        reason,
    };
    let known: Vec<(String, &Arg)> = cmd
        .get_arguments()
        .filter(|a| a.get_id() != CONFIG_ID)
        .filter_map(|a| Some((key_of(a)?, a)))
        .filter(|(k, _)| !SECRETS.contains(&k.as_str()))
        .collect();
    let mut out = Vec::new();
    for (key, value) in &table {
        if SECRETS.contains(&key.as_str()) {
            return Err(Error::SecretInFile {
                file: file.to_path_buf(),
                key: key.clone(),
                env: env_of(key),
            });
        }
        if key == CONFIG_ID {
            return Err(bad(key, "a config file does not name another".into()));
        }
        let Some((_, arg)) = known.iter().find(|(k, _)| k == key) else {
            let suggestion = known
                .iter()
                .map(|(k, _)| (strsim::jaro_winkler(k, key), k))
                .filter(|(score, _)| *score > 0.8)
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, k)| k.clone());
            return Err(Error::UnknownKey {
                file: file.to_path_buf(),
                key: key.clone(),
                suggestion,
            });
        };
        let values = values_of(arg, value).map_err(|r| bad(key, r))?;
        if !is_flag(arg) {
            for v in &values {
                check_value(arg, v).map_err(|r| bad(key, r))?;
            }
        }
        out.push(Setting {
            id: arg.get_id().to_string(),
            values,
        });
    }
    Ok(out)
}

/// A TOML value as the flag's raw values: a boolean for a flag that takes
/// none, an array (or one value) for a list, else a string or an integer.
fn values_of(arg: &Arg, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let scalar = |v: &toml::Value| match v {
        toml::Value::String(s) => Ok(OsString::from(s)),
        toml::Value::Integer(i) => Ok(OsString::from(i.to_string())),
        other => Err(format!(
            "want a string or an integer, got a {}",
            other.type_str()
        )),
    };
    if is_flag(arg) {
        return match value {
            toml::Value::Boolean(b) => Ok(vec![OsString::from(b.to_string())]),
            other => Err(format!(
                "want true or false (a TOML boolean), got a {}",
                other.type_str()
            )),
        };
    }
    match value {
        toml::Value::Array(items) if is_list(arg) => {
            if items.is_empty() {
                return Err("an empty list: leave the key out instead".into());
            }
            items.iter().map(scalar).collect()
        }
        toml::Value::Array(_) => Err("want one value, got a list".into()),
        v => Ok(vec![scalar(v)?]),
    }
}

/// Runs one value through the flag's own value parser (as clap would for
/// `--flag=value`), so the file is held to exactly the flag's rules.
fn check_value(arg: &Arg, value: &OsString) -> Result<(), String> {
    let probe = Arg::new("value")
        .long("value")
        .action(ArgAction::Set)
        .allow_hyphen_values(true)
        .value_parser(arg.get_value_parser().clone());
    let mut flag = OsString::from("--value=");
    flag.push(value);
    match Command::new("probe")
        .no_binary_name(true)
        .arg(probe)
        .try_get_matches_from([flag])
    {
        Ok(_) => Ok(()),
        Err(e) => {
            let why = std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.kind().to_string());
            Err(format!("invalid value {value:?}: {why}"))
        }
    }
}

/// The file's settings as the flags' defaults, below the command line and
/// the environment.
pub fn apply(mut cmd: Command, settings: &[Setting]) -> Command {
    for s in settings {
        let values = s.values.clone();
        cmd = cmd.mut_arg(&s.id, |a| {
            a.default_values(values.into_iter().map(clap::builder::OsStr::from))
                .required(false)
        });
    }
    cmd
}

/// Parses the process's command line for `P` (the whole `stele` command):
/// `stele server` gets its environment variables and its `--config` file.
/// Help, version and usage errors print and exit as clap's do.
pub fn parse_cli<P: clap::Parser>() -> anyhow::Result<P> {
    parse_cli_from(std::env::args_os().collect())
}

pub fn parse_cli_from<P: clap::Parser>(argv: Vec<OsString>) -> anyhow::Result<P> {
    let mut cmd = P::command().mut_subcommand(SERVER, prepare);
    // A first pass that ignores errors only finds the file: the settings
    // in it (`listen`, ...) are what makes the real pass succeed.
    let path = cmd
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(&argv)
        .ok()
        .and_then(|m| {
            m.subcommand_matches(SERVER)?
                .get_one::<PathBuf>(CONFIG_ID)
                .cloned()
        });
    if let Some(path) = path {
        let server = cmd
            .find_subcommand(SERVER)
            .expect("the server subcommand exists");
        let settings = load(server, &path)?;
        cmd = cmd.mut_subcommand(SERVER, |s| apply(s, &settings));
    }
    let m = match cmd.try_get_matches_from_mut(&argv) {
        Ok(m) => m,
        Err(e) => return Err(explain(&e, &argv).unwrap_or_else(|| e.exit())),
    };
    refuse_secret_flags(&m)?;
    Ok(P::from_arg_matches(&m).unwrap_or_else(|e| e.format(&mut cmd).exit()))
}

/// `stele server --config FILE` with nothing else on the command line,
/// parsed as the server parses it (environment variables included), for
/// `stele config check`.
pub fn parse_server_file<A: clap::Args + clap::FromArgMatches>(
    file: &Path,
) -> anyhow::Result<(A, ArgMatches)> {
    let cmd = prepare(A::augment_args(Command::new(SERVER)));
    let settings = load(&cmd, file)?;
    let mut cmd = apply(cmd, &settings);
    let argv = [
        OsString::from(SERVER),
        OsString::from("--config"),
        file.as_os_str().to_owned(),
    ];
    let m = cmd.try_get_matches_from_mut(&argv).map_err(|e| {
        explain(&e, &argv).unwrap_or_else(|| {
            anyhow::anyhow!(
                "config file {}: {}",
                file.display(),
                e.render()
                    .to_string()
                    .trim_start_matches("error: ")
                    .trim_end()
            )
        })
    })?;
    refuse_secret_flags(&m)?;
    Ok((A::from_arg_matches(&m)?, m))
}

/// A clap error in the terms of this module, where it has them: a missing
/// required setting names its key and variable; a bad value that came
/// from a `STELE_…` variable names the variable. (A file's values were
/// checked by [`load`] and never get here.)
fn explain(e: &clap::Error, argv: &[OsString]) -> Option<anyhow::Error> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    // Settings (flag, environment variable, config key) are the server's;
    // another command's error (`--timeout` without `--wait`) is clap's own.
    if !argv.iter().any(|a| a == SERVER) {
        return None;
    }
    let flags: Vec<String> = match e.get(ContextKind::InvalidArg)? {
        ContextValue::String(s) => vec![s.clone()],
        ContextValue::Strings(v) => v.clone(),
        _ => return None,
    };
    // "--heartbeat-ms <HEARTBEAT_MS>" -> "heartbeat_ms"
    let keys: Vec<String> = flags
        .iter()
        .filter_map(|f| f.strip_prefix("--")?.split([' ', '=']).next())
        .map(|l| l.replace('-', "_"))
        .collect();
    match e.kind() {
        ErrorKind::MissingRequiredArgument => {
            let named: Vec<String> = keys
                .iter()
                .map(|k| format!("{k} (--{}, {})", k.replace('_', "-"), env_of(k)))
                .collect();
            Some(anyhow::anyhow!(
                "missing setting: {} (a flag, an environment variable or a key of the --config file)",
                named.join(", ")
            ))
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let key = keys.first()?;
            let flag = format!("--{}", key.replace('_', "-"));
            let on_command_line = argv.iter().any(|a| {
                let a = a.to_string_lossy();
                a == flag || a.starts_with(&format!("{flag}="))
            });
            let env = env_of(key);
            if on_command_line || std::env::var_os(&env).is_none() {
                return None;
            }
            let value = match e.get(ContextKind::InvalidValue) {
                Some(ContextValue::String(v)) => format!(" {v:?}"),
                _ => String::new(),
            };
            let why = std::error::Error::source(e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.kind().to_string());
            Some(anyhow::anyhow!(
                "environment variable {env}: invalid value{value}: {why}"
            ))
        }
        _ => None,
    }
}

/// Refuses a secret given on the command line (of any subcommand), without
/// repeating it.
fn refuse_secret_flags(m: &ArgMatches) -> Result<(), Error> {
    for key in SECRETS {
        let present = m.ids().any(|id| id.as_str() == *key);
        if present && m.value_source(key) == Some(ValueSource::CommandLine) {
            return Err(Error::SecretFlag {
                flag: key.replace('_', "-"),
                key: key.to_string(),
                env: env_of(key),
            });
        }
    }
    match m.subcommand() {
        Some((_, sub)) => refuse_secret_flags(sub),
        None => Ok(()),
    }
}

/// A secret's value: from its environment variable (already in `value`)
/// or read from `file`; an error never contains the secret.
pub fn secret(
    key: &str,
    value: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<String>, Error> {
    match (value, file) {
        (Some(_), Some(_)) => Err(Error::SecretTwice {
            key: key.into(),
            env: env_of(key),
        }),
        (Some(v), None) => Ok(Some(v.to_string())),
        (None, None) => Ok(None),
        (None, Some(f)) => {
            let fail = |reason: String| Error::SecretFile {
                key: key.into(),
                file: f.to_path_buf(),
                reason,
            };
            let text = std::fs::read_to_string(f).map_err(|e| fail(e.to_string()))?;
            // A file written by `echo` ends in a newline that is not part
            // of the secret.
            let v = text.trim_end_matches(['\n', '\r']);
            if v.is_empty() {
                return Err(fail("empty".into()));
            }
            Ok(Some(v.to_string()))
        }
    }
}

/// `stele config default`: every key of `cmd` (a [`prepare`]d server
/// command) with its help text, environment variable and default, as a
/// TOML file that `stele config check` accepts.
pub fn default_file(cmd: &Command) -> String {
    let mut out = String::from(
        "# stele server configuration (`stele server --config FILE`).\n\
         # Every key is a flag of `stele server` (key heartbeat_ms: flag\n\
         # --heartbeat-ms, environment variable STELE_HEARTBEAT_MS). A flag\n\
         # beats its environment variable, which beats this file, which beats\n\
         # the default. Secrets (S3 keys) are never keys here: set their\n\
         # environment variable or name a file holding them (`..._file`).\n\
         # Every value below is the default; keys commented out have none.\n",
    );
    for arg in cmd.get_arguments() {
        let Some(key) = key_of(arg) else { continue };
        if arg.get_id() == CONFIG_ID || SECRETS.contains(&key.as_str()) {
            continue;
        }
        out.push('\n');
        if let Some(help) = arg.get_help() {
            for line in wrap(&help.to_string(), 74) {
                out.push_str(&format!("# {line}\n"));
            }
        }
        let env = arg
            .get_env()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_else(|| env_of(&key));
        out.push_str(&format!(
            "# flag --{}, environment {env}\n",
            arg.get_long().unwrap_or_default()
        ));
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let example = EXAMPLES.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        if is_flag(arg) {
            let on = defaults.first().is_some_and(|d| d == "true");
            out.push_str(&format!("{key} = {on}\n"));
        } else if !defaults.is_empty() {
            let rendered: Vec<String> = defaults.iter().map(|d| literal(d)).collect();
            if is_list(arg) {
                out.push_str(&format!("{key} = [{}]\n", rendered.join(", ")));
            } else {
                out.push_str(&format!("{key} = {}\n", rendered[0]));
            }
        } else if let Some(example) = example {
            out.push_str("# required (this value is an example)\n");
            out.push_str(&format!("{key} = {}\n", literal(example)));
        } else if is_list(arg) {
            out.push_str(&format!("# {key} = []\n"));
        } else {
            out.push_str(&format!("# {key} = \"\"\n"));
        }
    }
    out
}

/// A default as a TOML literal: an integer when it reads as one (the file
/// takes integers and strings alike for any flag), else a string.
fn literal(v: &str) -> String {
    if v.parse::<i64>().is_ok() {
        v.to_string()
    } else {
        toml::Value::String(v.to_string()).to_string()
    }
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for para in text.lines() {
        let mut line = String::new();
        for word in para.split_whitespace() {
            if !line.is_empty() && line.len() + 1 + word.len() > width {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        lines.push(line);
    }
    lines
}

#[cfg(test)]
#[path = "config_test.rs"]
mod tests;
