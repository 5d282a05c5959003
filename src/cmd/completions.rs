//! `stele completions bash|zsh|fish`: the shell's completion script for
//! every subcommand and flag, on stdout (clap_complete), e.g.
//! `stele completions bash > /etc/bash_completion.d/stele` or
//! `source <(stele completions bash)`.

/// The shells a script is written for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: Shell,
}

/// Writes the script for `cmd` (the whole command line) to stdout.
pub fn run(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<()> {
    let shell = match a.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let name = cmd.get_name().to_string();
    // Written whole, then copied: clap_complete panics on a closed pipe
    // (`| head`); a reader that stopped early is no error.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    match std::io::Write::write_all(&mut std::io::stdout().lock(), &script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
