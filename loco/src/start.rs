//! Loco's `start` command builds the application's context twice; the switch to
//! `BackgroundQueue` that [`TaskDedupQueue::install`](crate::TaskDedupQueue::install)
//! makes must reach the second build only.
//!
//! loco-rs 1.2's `cli::main` builds a context for every command (`boot::create_context`,
//! which ends with `Hooks::after_context`). For `start` it then hands that context's
//! config to `boot::create_app`, which builds a second context from it, and that build
//! refuses `workers.mode: BackgroundQueue` without a `queue:` section
//! (`bgworker::create_queue_provider`) before `after_context` runs again. The first
//! context of a `start` process serves as nothing but the second one's config, so
//! `install` leaves its mode as configured; the second build, which the server and the
//! workers run on, gets `BackgroundQueue`. Every other command (`task`, `jobs`,
//! `scheduler`, `db`, ...) builds one context, which gets it too.
//!
//! Loco keeps the command to itself, so it is read here from the process's arguments
//! as Loco's command line has them.

use std::ffi::OsStr;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this process runs Loco's `start` command.
static STARTS: LazyLock<bool> = LazyLock::new(|| is_start(std::env::args_os().skip(1)));

/// Whether the first context build of a `start` process went by.
static FIRST_BUILD_DONE: AtomicBool = AtomicBool::new(false);

/// Whether the context being built is the first of a `start` process: the one whose
/// config Loco builds the second from. True once at most per process.
pub(crate) fn first_build_of_start() -> bool {
    *STARTS && !FIRST_BUILD_DONE.swap(true, Ordering::SeqCst)
}

/// Whether `args` (the process's arguments after the program) are Loco's `start`
/// command: loco-rs 1.2's command line (`cli::Cli`) is a global `-e`/`--environment`
/// option with its value, anywhere, then the subcommand, `start` or its alias `s`.
pub(crate) fn is_start<I, S>(args: I) -> bool
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(arg) = arg.as_ref().to_str() else {
            return false;
        };
        match arg {
            // The option's value is the next argument.
            "-e" | "--environment" => {
                args.next();
            }
            // `--environment=test`, `-etest`, `-e=test`.
            _ if arg.starts_with("--environment=") || arg.starts_with("-e") => {}
            // `--help`, `--version`: no command runs.
            _ if arg.starts_with('-') => return false,
            command => return command == "start" || command == "s",
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::is_start;

    #[test]
    fn loco_start_in_every_spelling() {
        for args in [
            &["start"][..],
            &["s"],
            &["start", "--server-and-worker"],
            &["start", "--worker"],
            &["start", "--worker=mail,reports"],
            &["-e", "production", "start"],
            &["--environment", "production", "start", "-s"],
            &["--environment=production", "start"],
            &["-eproduction", "s", "--all"],
        ] {
            assert!(is_start(args), "{args:?}");
        }
    }

    #[test]
    fn other_commands_build_one_context() {
        for args in [
            &[][..],
            &["task", "start"],
            &["jobs", "tidy"],
            &["db", "migrate"],
            &["scheduler", "--list"],
            &["-e", "start", "routes"],
            &["--environment", "s", "doctor"],
            &["--help", "start"],
            &["watch", "--server-and-worker"],
            &["starts"],
        ] {
            assert!(!is_start(args), "{args:?}");
        }
    }
}
