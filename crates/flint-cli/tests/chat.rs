//! End-to-end tests of `flint chat`: a conversation piped through stdin (prefix reuse shows in
//! `/stats`), Ctrl-C under a pseudo-terminal (tmux) ending a reply but not the program, and
//! the refusal of a model without a chat template. CPU backend, greedy, short replies.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::model_path;

fn flint_bin() -> &'static str {
    env!("CARGO_BIN_EXE_flint")
}

/// The `cached prompt tokens: N` figures `/stats` printed, in order.
fn cached_counts(stdout: &str) -> Vec<usize> {
    stdout.lines().filter_map(|l| l.strip_prefix("cached prompt tokens: ")).map(|n| n.trim().parse().unwrap()).collect()
}

#[test]
fn piped_conversation_reuses_the_prefix() {
    let t0 = Instant::now();
    let m = model_path("qwen2.5-coder-0.5b");
    let mut child = Command::new(flint_bin())
        .args(["chat", "--backend", "cpu", "--temp", "0", "-n", "12", "-m", &m])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run flint chat");
    let input = "What is the capital of France? Answer in one word.\n/stats\nAnd of Germany?\n/stats\n/bye\n";
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "flint chat failed: {stderr}\nstdout:\n{stdout}");
    assert!(stdout.contains("Paris"), "the first reply lacks Paris:\n{stdout}");
    let first_reply = stdout.lines().next().unwrap_or("");
    assert!(!first_reply.trim().is_empty() && !first_reply.starts_with("prompt tokens"), "no first reply:\n{stdout}");
    let cached = cached_counts(&stdout);
    assert_eq!(cached.len(), 2, "expected two /stats blocks:\n{stdout}");
    assert_eq!(cached[0], 0, "the first turn starts from an empty cache");
    assert!(cached[1] > 0, "the second turn reused no prefix:\n{stdout}");
    // The second reply sits between the two /stats blocks.
    let second = stdout.split("context: ").nth(1).and_then(|s| s.split_once('\n')).map(|(_, rest)| rest).unwrap_or("");
    assert!(!second.starts_with("prompt tokens"), "no second reply:\n{stdout}");
    // One timing line per reply on stderr.
    assert_eq!(stderr.lines().filter(|l| l.contains(" cached") && l.contains("tok/s")).count(), 2, "stderr:\n{stderr}");
    eprintln!("piped chat: ok in {:.1} s, second turn reused {} prompt tokens", t0.elapsed().as_secs_f64(), cached[1]);
}

#[test]
fn chat_refuses_a_model_without_template() {
    let out = Command::new(flint_bin()).args(["chat", "-m", &model_path("gemma-3-270m")]).stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(out.stdout.is_empty());
    assert_eq!(stderr.trim_end().lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.contains("no chat template") && stderr.contains("flint run"), "{stderr}");
}

/// A private tmux server; killed when dropped, on failure too.
struct Tmux {
    socket: String,
    session: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").args(["-L", &self.socket]).args(args).output().expect("run tmux")
    }

    fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.session];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).status.success(), "tmux send-keys {keys:?} failed");
    }

    fn type_line(&self, line: &str) {
        self.send(&["-l", line]);
        self.send(&["Enter"]);
    }

    /// The pane with its scrollback, wrapped lines joined.
    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-J", "-S", "-500", "-t", &self.session]).stdout).into_owned()
    }

    /// Polls the pane until `ok` holds; panics with the screen after `limit`.
    fn wait_for(&self, what: &str, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(t0.elapsed() < limit, "timed out after {limit:?} waiting for {what}; the pane shows:\n{screen}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// The last non-empty line of the pane.
fn last_line(screen: &str) -> &str {
    screen.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim_end()
}

#[test]
fn ctrl_c_ends_the_reply_not_the_program() {
    let t0 = Instant::now();
    let have_tmux = Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success());
    assert!(have_tmux, "tmux is missing: this test drives flint chat through a pseudo-terminal with it (apt-get install tmux)");
    let m = model_path("qwen2.5-coder-0.5b");
    let tmux = Tmux { socket: format!("flint-chat-test-{}", std::process::id()), session: "chat".into() };
    let command = format!("'{}' chat --backend cpu --temp 0 -n 400 -m '{m}'; echo FLINT-EXIT=$?; sleep 600", flint_bin());
    let started = tmux.cmd(&["new-session", "-d", "-s", &tmux.session, "-x", "160", "-y", "50", &command]);
    assert!(started.status.success(), "tmux new-session failed: {}", String::from_utf8_lossy(&started.stderr));

    tmux.wait_for("the first prompt", Duration::from_secs(120), |s| last_line(s) == ">>>");
    let question = "Write a long, detailed essay about the history of computing.";
    tmux.type_line(question);
    // Some reply text after the question line.
    tmux.wait_for("the reply to start", Duration::from_secs(180), |s| s.split_once(question).is_some_and(|(_, after)| after.trim().len() >= 20));
    tmux.send(&["C-c"]);
    let screen = tmux.wait_for("the reply to end and the prompt to return", Duration::from_secs(60), |s| s.contains("interrupted]") && last_line(s) == ">>>");
    assert!(!screen.contains("FLINT-EXIT"), "flint exited on Ctrl-C:\n{screen}");

    // The REPL takes the next line: the stats of the cut reply.
    tmux.type_line("/stats");
    tmux.wait_for("/stats after the interrupted reply", Duration::from_secs(30), |s| s.contains("finish reason: abort") && last_line(s) == ">>>");
    // Ctrl-C at the prompt only says how to leave.
    tmux.send(&["C-c"]);
    tmux.wait_for("the exit hint", Duration::from_secs(30), |s| s.contains("Use /bye or Ctrl-D to exit"));
    tmux.type_line("/bye");
    tmux.wait_for("flint to exit 0", Duration::from_secs(30), |s| s.contains("FLINT-EXIT=0"));
    eprintln!("ctrl-c under tmux: ok in {:.1} s", t0.elapsed().as_secs_f64());
}
