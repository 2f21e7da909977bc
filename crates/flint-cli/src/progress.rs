//! The line a run prints while its GPU kernels compile. Most drivers compile a kernel in
//! milliseconds; a driver that compiles on the CPU (Mesa's lavapipe) takes seconds for each of
//! a model's larger kernels, in every process. The line appears only when compiling has gone
//! on for a second, and a summary follows when it stops:
//!
//! ```text
//! compiling GPU kernels...
//! GPU kernels ready: 14 compiled, 3.5 s
//! ```
//!
//! The time counts the compiles and the steps that first run a kernel (llvmpipe compiles a
//! kernel when it first runs it), so it includes those steps' own work.
//!
//! Both go to stderr, which is the server's log; the watcher thread starts with the first
//! compile and lives as long as the process. A line never lands inside streamed text: when
//! the reply on a terminal is mid-line ([`wrote_text`]), the status line starts a new one.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use flint::{CompileEvent, CompileProgress};

/// Compiling this long unseen shows the line.
const SHOW_AFTER: Duration = Duration::from_secs(1);
/// No compile for this long after the line ends the phase with its summary.
const QUIET: Duration = Duration::from_millis(500);
const TICK: Duration = Duration::from_millis(100);

#[derive(Default)]
struct Phase {
    /// When the compile under way started.
    since: Option<Instant>,
    /// When the last compile ended.
    last: Option<Instant>,
    /// Compiles and their time since the phase began.
    compiled: usize,
    busy: Duration,
    shown: bool,
}

impl Phase {
    /// What the watcher prints now, if anything.
    fn tick(&mut self, now: Instant) -> Option<String> {
        let running = self.since.map_or(Duration::ZERO, |s| now - s);
        if !self.shown && self.busy + running >= SHOW_AFTER {
            self.shown = true;
            return Some("compiling GPU kernels...".into());
        }
        let idle = self.since.is_none() && self.last.is_some_and(|l| now - l >= QUIET);
        if idle {
            let line = self.shown.then(|| format!("GPU kernels ready: {} compiled, {:.1} s", self.compiled, self.busy.as_secs_f64()));
            *self = Phase::default();
            return line;
        }
        None
    }
}

fn phase() -> &'static Arc<Mutex<Phase>> {
    static PHASE: OnceLock<Arc<Mutex<Phase>>> = OnceLock::new();
    PHASE.get_or_init(|| {
        let p = Arc::new(Mutex::new(Phase::default()));
        let watched = p.clone();
        let _ = std::thread::Builder::new().name("flint-compile-line".into()).spawn(move || loop {
            std::thread::sleep(TICK);
            let line = watched.lock().ok().and_then(|mut p| p.tick(Instant::now()));
            if let Some(line) = line {
                let cut = MID_LINE.swap(false, Ordering::SeqCst) && std::io::stdout().is_terminal();
                eprintln!("{}{line}", if cut { "\n" } else { "" });
            }
        });
        p
    })
}

/// Whether the text on stdout last ended inside a line.
static MID_LINE: AtomicBool = AtomicBool::new(false);

/// Notes text just written to stdout, so that a status line printed next starts on a line of
/// its own.
pub fn wrote_text(text: &str) {
    if let Some(c) = text.chars().last() {
        MID_LINE.store(c != '\n', Ordering::SeqCst);
    }
}

/// The observer every GPU load of the CLI passes to the engine.
pub fn compile_line() -> CompileProgress {
    CompileProgress(Arc::new(|e: &CompileEvent| {
        let Ok(mut p) = phase().lock() else { return };
        let now = Instant::now();
        match e {
            CompileEvent::Start { .. } | CompileEvent::FirstUse { done: false } => p.since = Some(now),
            CompileEvent::Done { .. } | CompileEvent::FirstUse { done: true } => {
                if let Some(s) = p.since.take() {
                    p.busy += now - s;
                }
                p.compiled += matches!(e, CompileEvent::Done { .. }) as usize;
                p.last = Some(now);
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shows_only_a_slow_phase_then_sums_it_up() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        // Fast compiles (a warm driver cache): nothing, and the phase resets quietly.
        let mut p = Phase { compiled: 5, busy: Duration::from_millis(300), last: Some(at(0)), ..Phase::default() };
        assert_eq!(p.tick(at(100)), None);
        assert_eq!(p.tick(at(600)), None);
        assert_eq!(p.compiled, 0);
        // One compile running for more than a second shows the line once.
        p.since = Some(at(1000));
        assert_eq!(p.tick(at(1500)), None);
        assert!(p.tick(at(2100)).is_some_and(|l| l.starts_with("compiling GPU kernels")));
        assert_eq!(p.tick(at(2200)), None);
        // It ends; quiet for half a second prints the summary.
        p.since = None;
        p.busy = Duration::from_millis(1500);
        p.compiled = 1;
        p.last = Some(at(2500));
        assert_eq!(p.tick(at(2700)), None);
        assert_eq!(p.tick(at(3000)).as_deref(), Some("GPU kernels ready: 1 compiled, 1.5 s"));
        assert!(!p.shown);
    }
}
