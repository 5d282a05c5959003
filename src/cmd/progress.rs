//! Waiting on the cell and showing how far it got: `--wait` and its
//! `--timeout`, shared by every command that starts something the cell
//! finishes later (moves, splits, merges, transfers, drains, restart-safe),
//! and the progress of a restore.
//!
//! ```text
//! stderr a terminal    indicatif bar or spinner, redrawn in place
//! stderr a pipe/file   plain lines, one per change (tests, logs, CI)
//! --json               nothing on stderr but errors; stdout is the JSON
//! ```
//! Nothing here writes to stdout: what a script parses is never broken
//! by a progress display.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::duration::{parse_timeout, show};

/// How long `--wait` waits by default: longer than any one phase of an
/// intent may take before the controller fails it (120 s).
pub const WAIT_TIMEOUT_DEFAULT: &str = "10m";

/// `--wait [--timeout D]`.
#[derive(Debug, Clone, Args)]
pub struct Wait {
    /// Wait until it is done (progress on stderr).
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long and exit nonzero (what was
    /// started goes on in the cell). E.g. 90s, 10m, 1h 30m.
    #[arg(long, value_name = "DURATION", default_value = WAIT_TIMEOUT_DEFAULT,
          value_parser = parse_timeout, requires = "wait")]
    pub timeout: Duration,
}

/// A `--wait` in progress: its start, its limit and its display.
pub struct Waiting {
    started: Instant,
    timeout: Duration,
    pub shown: Progress,
}

impl Waiting {
    /// `quiet` (`--json`): no display at all.
    pub fn new(timeout: Duration, quiet: bool) -> Waiting {
        Waiting {
            started: Instant::now(),
            timeout,
            shown: Progress::spinner(quiet),
        }
    }

    /// Sleeps before the next look: `poll`, or less if the limit is near.
    /// `Err` once the limit has passed: an error that names what was being
    /// waited for (`what`), how far it got (`how_far`) and what goes on
    /// without this command (`goes_on`).
    pub async fn next(
        &self,
        poll: Duration,
        what: &str,
        how_far: &str,
        goes_on: &str,
    ) -> anyhow::Result<()> {
        let elapsed = self.started.elapsed();
        if elapsed >= self.timeout {
            self.shown.abandon();
            anyhow::bail!(
                "gave up waiting for {what} after {} (--timeout {}): {how_far}; {goes_on}",
                show(elapsed),
                show(self.timeout)
            );
        }
        tokio::time::sleep(poll.min(self.timeout - elapsed)).await;
        Ok(())
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// A progress display on stderr: an indicatif bar on a terminal, plain
/// lines elsewhere, nothing when quiet.
pub struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    /// Plain lines: the last state printed, and the bytes done with when
    /// they were last printed.
    last_state: Mutex<String>,
    bytes: Mutex<(u64, Instant)>,
    /// What a bar of bytes is of (`restoring cell c1`).
    label: String,
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template")
}

fn bytes_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}, ETA {eta}",
    )
    .expect("a valid template")
    .progress_chars("=> ")
}

/// How often a plain byte count is printed at most.
const PLAIN_BYTES_EVERY: Duration = Duration::from_secs(2);

impl Progress {
    fn new(quiet: bool, bar: impl FnOnce() -> ProgressBar) -> Progress {
        let terminal = !quiet && std::io::stderr().is_terminal();
        Progress {
            bar: terminal.then(|| {
                let b = bar();
                b.set_draw_target(ProgressDrawTarget::stderr());
                b.enable_steady_tick(Duration::from_millis(120));
                b
            }),
            plain: !quiet && !terminal,
            last_state: Mutex::new(String::new()),
            bytes: Mutex::new((0, Instant::now())),
            label: String::new(),
        }
    }

    /// A spinner with a message and the time waited.
    pub fn spinner(quiet: bool) -> Progress {
        Progress::new(quiet, || {
            ProgressBar::new_spinner().with_style(spinner_style())
        })
    }

    /// A bar of bytes with the rate and the time left; its total comes
    /// with [`Progress::set_total`].
    pub fn bytes(what: &str, quiet: bool) -> Progress {
        let mut p = Progress::new(quiet, || ProgressBar::new(0).with_style(bytes_style()));
        if let Some(b) = &p.bar {
            b.set_message(what.to_string());
        }
        p.label = what.to_string();
        p
    }

    /// How many bytes there are to do in all.
    pub fn set_total(&self, total: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
        } else if self.plain {
            eprintln!("{}: {} to fetch", self.label, indicatif::HumanBytes(total));
        }
    }

    /// The current state, e.g. `intent 31: colocating`: redrawn on a
    /// terminal, a line of its own elsewhere when it changed.
    pub fn set(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
        } else if self.plain {
            let mut last = self.last_state.lock().expect("not poisoned");
            if *last != msg {
                eprintln!("{msg}");
                *last = msg.to_string();
            }
        }
    }

    /// `n` more bytes done (a bar made by [`Progress::bytes`]).
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        } else if self.plain {
            let mut bytes = self.bytes.lock().expect("not poisoned");
            bytes.0 += n;
            if bytes.1.elapsed() >= PLAIN_BYTES_EVERY {
                bytes.1 = Instant::now();
                eprintln!("  {} fetched", indicatif::HumanBytes(bytes.0));
            }
        }
    }

    /// Done: the bar is cleared (the result is printed after it); plain
    /// lines end with the bytes done, if any.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        } else if self.plain {
            let done = self.bytes.lock().expect("not poisoned").0;
            if done > 0 {
                eprintln!("  {} fetched, done", indicatif::HumanBytes(done));
            }
        }
    }

    /// Given up: the bar stays as it was, above the error.
    pub fn abandon(&self) {
        if let Some(b) = &self.bar {
            b.abandon();
        }
    }
}

/// A restore's progress shown as a bar of bytes.
impl stele_node::tier::restore::Progress for Progress {
    fn planned(&self, bytes: u64) {
        self.set_total(bytes);
    }

    fn fetched(&self, bytes: u64) {
        self.inc(bytes);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Waiting;

    /// The styles are built only on a terminal: a broken template would
    /// panic there and nowhere a test looks.
    #[test]
    fn styles_are_valid() {
        super::spinner_style();
        super::bytes_style();
    }

    #[tokio::test]
    async fn a_wait_gives_up_naming_what_and_how_far() {
        let w = Waiting::new(Duration::from_millis(20), true);
        let look = || {
            w.next(
                Duration::from_secs(5),
                "intent 7",
                "still pending",
                "it goes on",
            )
        };
        // Within the limit: a sleep of at most what is left, not the poll.
        let started = std::time::Instant::now();
        look().await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        let e = look().await.unwrap_err().to_string();
        assert!(
            e.starts_with("gave up waiting for intent 7 after ")
                && e.ends_with("(--timeout 20ms): still pending; it goes on"),
            "{e}"
        );
    }
}
