//! `/metrics` in Prometheus's text format: what the server counts as requests come and go,
//! and the scheduler's own figures (running and waiting sequences, KV blocks, steps and their
//! sizes) read from the engine when scraped.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use flint::{FinishReason, Histogram, SchedStats};

/// Upper bounds (seconds) of the latency histograms' buckets.
const SECONDS: [f64; 14] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0];

/// A latency histogram: counts per bucket of [`SECONDS`] (and one past the last), the sum.
#[derive(Default)]
struct Seconds {
    counts: [u64; SECONDS.len() + 1],
    sum: f64,
}

impl Seconds {
    fn observe(&mut self, s: f64) {
        let i = SECONDS.iter().position(|&b| s <= b).unwrap_or(SECONDS.len());
        self.counts[i] += 1;
        self.sum += s;
    }
}

/// Finish reasons counted apart (`error`: the request failed after it was accepted).
const REASONS: [&str; 5] = ["stop", "length", "abort", "error", "tool_calls"];

#[derive(Default)]
pub struct Metrics {
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    finished: [AtomicU64; 5],
    ttft: Mutex<Seconds>,
    itl: Mutex<Seconds>,
}

impl Metrics {
    pub fn prompt(&self, tokens: usize, cached: usize) {
        self.prompt_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        self.cached_tokens.fetch_add(cached as u64, Ordering::Relaxed);
    }

    pub fn generated(&self, tokens: usize) {
        self.generated_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    /// One choice ended (None: it failed).
    pub fn finished(&self, reason: Option<FinishReason>) {
        let i = match reason {
            Some(FinishReason::Stop) => 0,
            Some(FinishReason::Length) => 1,
            Some(FinishReason::Abort) => 2,
            None => 3,
            Some(FinishReason::ToolCalls) => 4,
        };
        self.finished[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn ttft(&self, s: f64) {
        self.ttft.lock().unwrap_or_else(|p| p.into_inner()).observe(s);
    }

    pub fn inter_token(&self, s: f64) {
        self.itl.lock().unwrap_or_else(|p| p.into_inner()).observe(s);
    }

    /// The whole text exposition, with the scheduler's figures when the engine is loaded.
    pub fn render(&self, sched: Option<&SchedStats>) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n");
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n");
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(&mut out, "flint_prompt_tokens_total", "Prompt tokens of finished requests.", load(&self.prompt_tokens));
        counter(&mut out, "flint_generated_tokens_total", "Tokens generated.", load(&self.generated_tokens));
        counter(&mut out, "flint_prefix_cache_hit_tokens_total", "Prompt tokens whose KV was reused, not prefilled.", load(&self.cached_tokens));
        let _ = write!(out, "# HELP flint_requests_total Choices ended, by finish reason.\n# TYPE flint_requests_total counter\n");
        for (r, c) in REASONS.iter().zip(&self.finished) {
            let _ = writeln!(out, "flint_requests_total{{finish_reason=\"{r}\"}} {}", load(c));
        }
        if let Some(s) = sched {
            gauge(&mut out, "flint_requests_running", "Sequences in the running batch.", s.running as u64);
            gauge(&mut out, "flint_requests_waiting", "Sequences waiting for admission.", s.waiting as u64);
            counter(&mut out, "flint_preemptions_total", "Sequences preempted (recomputed later) when KV blocks ran out.", s.preemptions);
            counter(&mut out, "flint_steps_total", "Forward steps run.", s.steps);
            gauge(&mut out, "flint_kv_blocks_total", "KV blocks in the pool, every group.", s.kv.total);
            gauge(&mut out, "flint_kv_blocks_used", "KV blocks held by live sequences.", s.kv.used);
            gauge(&mut out, "flint_kv_blocks_cached", "KV blocks held only by the prefix index.", s.kv.cached);
            counter(&mut out, "flint_spec_draft_tokens_total", "Draft tokens verified (speculative decoding).", s.spec.drafted);
            counter(&mut out, "flint_spec_accepted_tokens_total", "Draft tokens the model accepted.", s.spec.accepted);
            steps_histogram(&mut out, "flint_batch_sequences", "Sequences per step.", &s.batch_seqs);
            steps_histogram(&mut out, "flint_batch_tokens", "Tokens per step.", &s.batch_tokens);
        }
        seconds_histogram(&mut out, "flint_ttft_seconds", "From a request's arrival to its first token.", &self.ttft.lock().unwrap_or_else(|p| p.into_inner()));
        seconds_histogram(
            &mut out,
            "flint_inter_token_latency_seconds",
            "Between a choice's consecutive tokens.",
            &self.itl.lock().unwrap_or_else(|p| p.into_inner()),
        );
        out
    }
}

fn steps_histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} histogram\n");
    let mut cum = 0;
    for (i, c) in h.counts.iter().enumerate() {
        cum += c;
        let le = Histogram::bound(i).map_or_else(|| "+Inf".to_string(), |b| b.to_string());
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cum}");
    }
    let _ = write!(out, "{name}_sum {}\n{name}_count {cum}\n", h.sum);
}

fn seconds_histogram(out: &mut String, name: &str, help: &str, h: &Seconds) {
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} histogram\n");
    let mut cum = 0;
    for (i, c) in h.counts.iter().enumerate() {
        cum += c;
        let le = SECONDS.get(i).map_or_else(|| "+Inf".to_string(), |b| b.to_string());
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cum}");
    }
    let _ = write!(out, "{name}_sum {}\n{name}_count {cum}\n", h.sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_is_cumulative() {
        let m = Metrics::default();
        m.prompt(10, 4);
        m.generated(3);
        m.finished(Some(FinishReason::Length));
        m.ttft(0.3);
        m.ttft(7.0);
        let mut s = SchedStats::default();
        s.batch_seqs.observe(1);
        s.batch_seqs.observe(3);
        s.spec.add(5, 3);
        let text = m.render(Some(&s));
        for line in [
            "flint_prompt_tokens_total 10",
            "flint_prefix_cache_hit_tokens_total 4",
            "flint_requests_total{finish_reason=\"length\"} 1",
            "flint_batch_sequences_bucket{le=\"1\"} 1",
            "flint_batch_sequences_bucket{le=\"2\"} 1",
            "flint_batch_sequences_bucket{le=\"4\"} 2",
            "flint_batch_sequences_bucket{le=\"+Inf\"} 2",
            "flint_ttft_seconds_bucket{le=\"0.5\"} 1",
            "flint_ttft_seconds_bucket{le=\"10\"} 2",
            "flint_ttft_seconds_count 2",
            "flint_spec_draft_tokens_total 5",
            "flint_spec_accepted_tokens_total 3",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
