//! End-to-end tests of the `flint` binary: golden greedy runs, stop strings and
//! log-probabilities through `flint run`, and the exit-2-with-one-line contract for bad input.

mod common;

use std::process::{Command, Output};

use common::{model_path, shared};

use serde_json::Value;

fn flint(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flint")).args(args).output().expect("run flint")
}

fn json_file(rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(shared().join(rel)).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

/// `flint run --raw --backend cpu --temp 0 -n 32 --format jsonl -f PROMPT` for golden prompts 1
/// and 6 (the model's own) must reproduce the f32 reference's greedy ids, and the streamed
/// pieces its text. This checks the CLI's path: `golden_models.rs` runs all seven prompts
/// through the same CPU reference in-process, so the other five would only repeat its work.
fn golden_cli(model: &str, golden: &str, sixth: &str) {
    let path = model_path(model);
    for index in [1, 6] {
        let prompt = if index == 6 { sixth.to_string() } else { format!("p{index}.txt") };
        let prompt = shared().join("golden/prompts").join(prompt);
        let out = flint(&["run", "-m", &path, "--raw", "--backend", "cpu", "--temp", "0", "-n", "32", "--format", "jsonl", "-f", prompt.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{golden} {index}: flint failed: {stderr}");
        let lines: Vec<Value> = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let (summary, tokens) = lines.split_last().unwrap();
        let got: Vec<u64> = tokens.iter().filter_map(|l| l["token"].as_u64()).collect();
        let reference = json_file(&format!("golden/f32/{golden}/{index}.json"));
        let llama = json_file(&format!("golden/{golden}/{index}.json"));
        assert_eq!(got, ids(&reference["greedy_token_ids"]), "{golden} {index}: greedy ids differ from the f32 reference");
        assert_eq!(summary["done"], true);
        assert_eq!(summary["finish_reason"], "length");
        assert_eq!(summary["completion_tokens"], 32);
        assert_eq!(summary["prompt_tokens"].as_u64().unwrap() as usize, ids(&llama["prompt_token_ids"]).len());
        // Streamed text pieces concatenate to the reference's decoded continuation.
        let text: String = lines.iter().filter_map(|l| l["text"].as_str()).collect();
        let want_text = llama["greedy_text"].as_str().unwrap();
        if got == ids(&llama["greedy_token_ids"]) {
            assert_eq!(text, want_text, "{golden} {index}: streamed text differs");
        }
        eprintln!("{golden} {index}: ok, decode {} tok/s", summary["decode_tok_s"]);
    }
}

#[test]
fn run_gemma_golden_prompts() {
    golden_cli("gemma-3-270m", "gemma", "p6g.txt");
}

#[test]
fn run_qwen_golden_prompts() {
    golden_cli("qwen2.5-coder-0.5b", "qwen", "p6q.txt");
}

/// Bad flags and values exit 2 with exactly one line on stderr and nothing on stdout.
fn assert_usage_error(args: &[&str], needle: &str) {
    let out = flint(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: status {:?}, stderr {stderr}", out.status);
    assert!(out.stdout.is_empty(), "{args:?}: printed to stdout");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: stderr is not one line: {stderr}");
    assert!(stderr.contains(needle), "{args:?}: stderr {stderr:?} lacks {needle:?}");
}

#[test]
fn bad_values_exit_2_with_one_line() {
    let m = model_path("gemma-3-270m");
    assert_usage_error(&["run", "-m", &m, "--temp", "-1", "hi"], "temperature");
    assert_usage_error(&["run", "-m", &m, "--temp", "nan", "hi"], "temperature");
    assert_usage_error(&["run", "-m", &m, "--top-p", "1.5", "hi"], "top_p");
    assert_usage_error(&["run", "-m", &m, "--top-p", "0", "hi"], "top_p");
    assert_usage_error(&["run", "-m", &m, "--min-p", "2", "hi"], "min_p");
    assert_usage_error(&["run", "-m", &m, "--top-k", "-5", "hi"], "top_k");
    assert_usage_error(&["run", "-m", &m, "-n", "0", "hi"], "-n");
    assert_usage_error(&["run", "-m", &m, "--bogus-flag", "hi"], "bogus");
    assert_usage_error(&["run", "-m", &m, "--format", "xml", "hi"], "xml");
    assert_usage_error(&["run", "-m", &m], "prompt");
    assert_usage_error(&["run", "-m", &m, "-f", "/nonexistent/prompt.txt"], "prompt.txt");
    assert_usage_error(&["run", "-m", "/nonexistent/model.gguf", "hi"], "model.gguf");
    assert_usage_error(&["run", "-m", "no-such-catalog-model", "hi"], "no-such-catalog-model");
    assert_usage_error(&["run", "-m", &m, "--spec-type", "medusa", "hi"], "medusa");
    assert_usage_error(&["run", "-m", &m, "--exact", "-ctk", "f16", "hi"], "--exact");
    assert_usage_error(&["info", "-m", &m, "--exact", "-ctv", "q8_0"], "--exact");
    assert_usage_error(&["run", "-m", &m, "--spec-type", "ngram", "--draft-min", "9", "hi"], "--draft-min 9");
    assert_usage_error(&["bench", "-m", &m, "--spec-type", "ngram"], "-f FILE");
    assert_usage_error(&["bench", "-m", &m, "-f", "/nonexistent/prompt.txt"], "-f is for --spec-type");
    assert_usage_error(&["bench", "-m", &m, "-d", "64", "--concurrency", "2"], "--depth");
    assert_usage_error(&["bench", "-m", &m, "--max-batch-tokens", "0"], "--max-batch-tokens");
    assert_usage_error(&["bench", "-m", &m, "--max-batch-tokens", "99999999999"], "from 1 to 8192");
    // A draft model needs this model's vocabulary: refused before any weight is loaded.
    let q = model_path("qwen2.5-coder-0.5b");
    assert_usage_error(&["run", "-m", &m, "-md", &q, "hi"], "vocabulary");
    assert_usage_error(&["run", "-m", &m, "--model-draft", &m, "--spec-type", "ngram", "hi"], "choose one");
    assert_usage_error(&["run", "-m", &m, "-md", &m, "--draft-p-min", "2", "hi"], "--draft-p-min");
    assert_usage_error(&["bench", "-m", &m, "-md", &m], "-f FILE");
}

#[test]
fn malformed_model_exits_2_with_one_line() {
    let dir = std::env::temp_dir().join(format!("flint-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad_magic = dir.join("bad_magic.gguf");
    std::fs::write(&bad_magic, b"GGML\x03\0\0\0garbage").unwrap();
    assert_usage_error(&["run", "-m", bad_magic.to_str().unwrap(), "hi"], "GGUF");
    assert_usage_error(&["info", "-m", bad_magic.to_str().unwrap()], "GGUF");
    // A real model cut in half: the header parses, the tensor data is missing.
    let real = std::fs::read(model_path("gemma-3-270m")).unwrap();
    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &real[..real.len() / 2]).unwrap();
    assert_usage_error(&["run", "-m", truncated.to_str().unwrap(), "hi"], "past the end");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prompt_longer_than_context_is_refused_before_work() {
    let m = model_path("gemma-3-270m");
    let prompt = shared().join("golden/prompts/p7long.txt");
    assert_usage_error(&["run", "-m", &m, "--raw", "--backend", "cpu", "-c", "64", "-f", prompt.to_str().unwrap()], "context");
}

#[test]
fn info_describes_both_models() {
    let out = flint(&["info", "-m", &model_path("gemma-3-270m")]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in ["gemma3", "layers        18", "Q8_0", "llama", "local(window 512, base 10000)", "global(base 1000000)"] {
        assert!(text.contains(needle), "gemma info lacks {needle:?}:\n{text}");
    }
    let out = flint(&["info", "-m", &model_path("qwen2.5-coder-0.5b")]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in ["qwen2", "layers        24", "gpt2 (pre qwen2)", "chat template yes", "separate matrix"] {
        assert!(text.contains(needle), "qwen info lacks {needle:?}:\n{text}");
    }
}

/// `flint info` shows what each new family does differently.
#[test]
fn info_shows_the_families_settings() {
    let cases: [(&str, &[&str]); 4] = [
        ("qwen3moe", &["qwen3moe", "4 experts of 64 (Silu), 2 used per token", "QK-norm"]),
        ("gemma2", &["score soft cap 5", "soft cap 30", "local(window 16, base 10000) ×23 (layers 0, 2, 4, …)", "query scale 0.25"]),
        ("llama3", &["per-dimension frequency factors (rope_freqs.weight)", "tied to token embedding"]),
        ("phi3", &["phi3", "fused QKV"]),
    ];
    for (family, needles) in cases {
        let path = shared().join("golden/families").join(family).join("model.gguf");
        let out = flint(&["info", "-m", path.to_str().unwrap()]);
        assert!(out.status.success(), "{family}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        for needle in needles {
            assert!(text.contains(needle), "{family} info lacks {needle:?}:\n{text}");
        }
    }
}

#[test]
fn new_sampling_values_are_checked_before_the_model_loads() {
    let m = model_path("qwen2.5-coder-0.5b");
    assert_usage_error(&["run", "-m", &m, "--repeat-penalty", "0", "hi"], "--repeat-penalty");
    assert_usage_error(&["run", "-m", &m, "--repeat-last-n", "-2", "hi"], "--repeat-last-n");
    assert_usage_error(&["run", "-m", &m, "--presence-penalty", "3", "hi"], "--presence-penalty");
    assert_usage_error(&["run", "-m", &m, "--frequency-penalty", "-2.5", "hi"], "--frequency-penalty");
    assert_usage_error(&["run", "-m", &m, "--stop", "", "hi"], "--stop");
    assert_usage_error(&["run", "-m", &m, "--format", "jsonl", "--logprobs", "50", "hi"], "--logprobs");
    assert_usage_error(&["run", "-m", &m, "--logprobs", "3", "hi"], "jsonl");
    assert_usage_error(&["run", "-m", &m, "--raw", "--system", "be brief", "hi"], "--system");
    assert_usage_error(&["run", "-m", &m, "--chat-template-file", "/nonexistent/t.jinja", "hi"], "t.jinja");
    assert_usage_error(&["chat", "-m", &m, "--temp", "3"], "--temp");
}

/// A hostile chat template stops with one clear line and exit 2, quickly (the budgets of
/// `flint_core::chat`), instead of running for minutes or allocating until killed.
#[test]
fn hostile_chat_templates_exit_2() {
    let m = model_path("gemma-3-270m");
    let dir = std::env::temp_dir().join(format!("flint-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let doubling = "{% set a = 'x' %}".to_string() + &"{% set a = a ~ a %}".repeat(40) + "{{ a }}";
    for (name, source) in [
        ("loops", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}".to_string()),
        ("doubling", doubling),
        ("list doubling", "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}".to_string()),
        ("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".to_string()),
    ] {
        let file = dir.join(format!("{name}.jinja"));
        std::fs::write(&file, source).unwrap();
        let t0 = std::time::Instant::now();
        assert_usage_error(&["run", "-m", &m, "--backend", "cpu", "--chat-template-file", file.to_str().unwrap(), "hi"], "chat template stopped");
        eprintln!("{name}: exit 2 after {:.2} s, the model load included", t0.elapsed().as_secs_f64());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn system_needs_a_chat_template() {
    let m = model_path("gemma-3-270m");
    assert_usage_error(&["run", "-m", &m, "--system", "be brief", "hi"], "no chat template");
}

/// JSON lines of a successful `flint run --format jsonl`: (token lines, summary).
fn jsonl_run(args: &[&str]) -> (Vec<Value>, Value) {
    let out = flint(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<Value> = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let summary = lines.pop().expect("a summary line");
    assert_eq!(summary["done"], true);
    (lines, summary)
}

/// A stop string that spans two tokens (" United" + " States" in gemma's greedy continuation
/// of golden prompt 1) ends the output right before it; the stop text is never emitted.
#[test]
fn stop_string_across_tokens() {
    let prompt = shared().join("golden/prompts/p1.txt");
    let stop = " United St";
    let (lines, summary) = jsonl_run(&[
        "run",
        "-m",
        &model_path("gemma-3-270m"),
        "--backend",
        "cpu",
        "--temp",
        "0",
        "--raw",
        "-n",
        "32",
        "--format",
        "jsonl",
        "--stop",
        stop,
        "-f",
        prompt.to_str().unwrap(),
    ]);
    let greedy = json_file("golden/f32/gemma/1.json")["greedy_text"].as_str().unwrap().to_string();
    let want = &greedy[..greedy.find(stop).expect("the stop string is in the reference text")];
    let text: String = lines.iter().filter_map(|l| l["text"].as_str()).collect();
    assert_eq!(text, want);
    assert_eq!(summary["finish_reason"], "stop");
    // " United" was held back (it might begin the stop string), then " States" completed it.
    let tail: Vec<&str> = lines.iter().rev().take(2).map(|l| l["text"].as_str().unwrap()).collect();
    assert_eq!(tail, ["", ""], "the last two tokens should print nothing");
    assert_eq!(summary["completion_tokens"].as_u64().unwrap() as usize, lines.len());
}

#[test]
fn logprobs_in_jsonl() {
    let (lines, summary) = jsonl_run(&[
        "run",
        "-m",
        &model_path("qwen2.5-coder-0.5b"),
        "--backend",
        "cpu",
        "--temp",
        "0",
        "-n",
        "6",
        "--format",
        "jsonl",
        "--logprobs",
        "3",
        "Name three colors.",
    ]);
    assert!(summary["cached_prompt_tokens"].is_u64(), "summary lacks cached_prompt_tokens: {summary}");
    let tokens: Vec<&Value> = lines.iter().filter(|l| l.get("token").is_some()).collect();
    assert!(!tokens.is_empty());
    for line in tokens {
        let logprob = line["logprob"].as_f64().unwrap_or_else(|| panic!("no logprob: {line}"));
        assert!(logprob <= 0.0, "{line}");
        let top = line["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{line}");
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "not sorted descending: {line}");
        assert!(top.iter().all(|t| t["token"].is_u64() && t["text"].is_string()), "{line}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], line["token"], "{line}");
        assert_eq!(lps[0], logprob, "{line}");
    }
}

/// A headless GPU run without XDG_RUNTIME_DIR prints nothing about it (Mesa's device-select
/// layer, through libwayland, would say `error: XDG_RUNTIME_DIR is invalid...` twice).
#[test]
fn no_runtime_dir_noise_on_a_headless_gpu_run() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["run", "-m", &model_path("gemma-3-270m"), "--raw", "--temp", "0", "-n", "1", "--self-test", "hi"])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
    // The same run checked the GPU against the CPU reference at load.
    assert!(stderr.lines().any(|l| l.starts_with("self-test passed on ") && l.contains("6 taps within NMSE 1e-5")), "{stderr}");
}

/// A model part the device cannot hold fails the load with exit 2 and one line naming it and
/// its size. lavapipe overcommits host memory, so the test-only switch fails the allocation.
#[test]
fn out_of_memory_names_what_did_not_fit() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let model = shared().join("golden/families/qwen3/model.gguf");
    for (part, needle) in [("kv", "GPU out of memory: the KV cache ("), ("weights", "GPU out of memory: the weights (")] {
        let out = Command::new(env!("CARGO_BIN_EXE_flint"))
            .args(["run", "-m", model.to_str().unwrap(), "--raw", "-n", "1", "hi"])
            .env("FLINT_TEST_FAIL_ALLOC", part)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{part}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(errors[0].contains(needle) && errors[0].contains(" MiB") && errors[0].contains("did not fit on "), "{part}: {stderr}");
        assert!(errors[0].contains("--kv-budget-mb"), "{stderr}");
    }
}

/// `--self-test` with a deliberately wrong kernel (the test-only switch: every 16th value of
/// the gated activation lost) fails the load with exit 1 and one line naming the adapter and
/// the first tap that differs; the attention tap before it still passes.
#[test]
fn self_test_catches_a_wrong_kernel() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let model = shared().join("golden/families/qwen3/model.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["run", "-m", model.to_str().unwrap(), "--raw", "--temp", "0", "-n", "1", "--self-test", "hi"])
        .env("FLINT_TEST_WRONG_KERNEL", "glu")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let adapter = flint_gpu::testing::context().unwrap().info.name.clone();
    assert!(errors[0].contains(&format!("self-test failed on {adapter}")), "{stderr}");
    assert!(errors[0].contains("prompt step: layer 0 after the feed-forward block differs from the CPU reference"), "{stderr}");
}

/// The GPU kernels and graph (lane teams, norms folded into matmuls, Q/K/V and gate/up fused,
/// split attention) run on this CPU-type adapter through the test-only FLINT_TEST_GPU_KERNELS
/// switch: greedy ids equal the f32 reference's with the self-test on (layer 0 and the head
/// agree with the CPU reference within NMSE 1e-5), in the exact mode and in the default mode
/// (whose prompt steps take the tiled GEMM and the query-tiled attention), and in the default
/// mode on 8-bit activations (`FLINT_TUNE=q8_act=on,gemm_in=q8`: the mat-vec kernels' and the
/// prompt step's GEMM; the self-test allows NMSE 5e-4 there, and must say so). One test per model,
/// so the two share the machine with the other tests (on lavapipe these kernels run several
/// times slower than the CPU-adapter family: a qwen decode step takes seconds).
fn gpu_kernels_keep_the_golden_ids(model: &str, golden: &str) -> bool {
    if flint_gpu::testing::context().is_none() {
        return false;
    }
    // The exact mode on golden prompt 1 (12 and 13 tokens: the token-block kernels), and the
    // default mode on prompt 2 (32 and 39 tokens: the prompt step takes the tiled GEMM and
    // the query-tiled attention, and the KV cache is f16; the reference's top two logits stay
    // at least 0.2 apart there). Four tokens: the prompt step, then decode steps of the same
    // kernels.
    let path = model_path(model);
    for (n, exact, tune) in [(1, true, ""), (2, false, ""), (2, false, "q8_act=on,gemm_in=q8")] {
        let prompt = shared().join(format!("golden/prompts/p{n}.txt"));
        let mut args = vec!["run", "-m", &path, "--raw", "--temp", "0", "-n", "4", "--self-test", "--format", "jsonl", "-f", prompt.to_str().unwrap()];
        args.extend(exact.then_some("--exact"));
        let mode = match (exact, tune) {
            (true, _) => "the exact mode",
            (false, "") => "the default mode",
            _ => "the default mode on 8-bit activations",
        };
        let out = Command::new(env!("CARGO_BIN_EXE_flint")).args(&args).env("FLINT_TEST_GPU_KERNELS", "1").env("FLINT_TUNE", tune).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{model}, {mode}: {stderr}");
        let bound = if tune.is_empty() { "within NMSE 1e-5" } else { "within NMSE 5e-4" };
        assert!(stderr.lines().any(|l| l.starts_with("self-test passed") && l.contains(bound)), "{model}, {mode}: {stderr}");
        let got: Vec<u64> =
            String::from_utf8(out.stdout).unwrap().lines().filter_map(|l| serde_json::from_str::<Value>(l).unwrap()["token"].as_u64()).collect();
        let want = ids(&json_file(&format!("golden/f32/{golden}/{n}.json"))["greedy_token_ids"]);
        assert_eq!(got, want[..4], "{model}, {mode}: greedy ids on prompt {n} with the GPU kernels differ from the f32 reference");
    }
    true
}

fn gpu_kernels(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flint")).args(args).env("FLINT_TEST_GPU_KERNELS", "1").output().unwrap()
}

#[test]
fn gpu_kernels_keep_gemmas_golden_ids() {
    gpu_kernels_keep_the_golden_ids("gemma-3-270m", "gemma");
}

/// And a one-sequence decode step of qwen records at most 6 dispatches a layer plus 8 (issue
/// 35), the sampler included.
#[test]
fn gpu_kernels_keep_qwens_golden_ids_in_few_dispatches() {
    if !gpu_kernels_keep_the_golden_ids("qwen2.5-coder-0.5b", "qwen") {
        return;
    }
    let out = gpu_kernels(&["bench", "-m", &model_path("qwen2.5-coder-0.5b"), "-p", "8", "-n", "2", "--reps", "1", "--profile", "--format", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let one = report["decode_profile_us"].as_array().unwrap().iter().find(|p| p["sequences"] == 1).unwrap();
    let dispatches: u64 = one["ops"].as_array().unwrap().iter().map(|op| op["dispatches"].as_u64().unwrap()).sum();
    let n_layer = 24;
    assert!(dispatches <= 6 * n_layer + 8, "a one-sequence decode step of qwen records {dispatches} dispatches: {}", one["ops"]);
    eprintln!("qwen one-sequence decode step: {dispatches} dispatches");
}

/// `flint tokenize` on llama.cpp's vocabulary-only files: its suite's ids (no BOS, specials as
/// text), the default `id -> 'piece'` lines, BOS by the vocabulary's default, specials parsed.
#[test]
fn tokenize_vocabulary_only_files() {
    let vocab = |name: &str| shared().join(format!("golden/llama-cpp-vocab/ggml-vocab-{name}.gguf")).to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let out = flint(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    for name in ["qwen2", "llama-spm", "deepseek-llm"] {
        let inp = std::fs::read_to_string(format!("{}.inp", vocab(name))).unwrap();
        let out = std::fs::read_to_string(format!("{}.out", vocab(name))).unwrap();
        // The suite's string "Hello world" and its ids.
        let index = inp.split("\n__ggml_vocab_test__\n").position(|s| s == "Hello world").unwrap();
        let want: Vec<u64> = out.lines().nth(index).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect();
        let got: Vec<u64> = serde_json::from_str(&run(&["tokenize", "-m", &vocab(name), "--ids", "--no-bos", "--no-parse-special", "Hello world"])).unwrap();
        assert_eq!(got, want, "{name}");
    }
    // llama-spm adds BOS (id 1) by default; lines are `id -> 'piece'` as llama-tokenize prints.
    let lines = run(&["tokenize", "-m", &vocab("llama-spm"), "Hello world"]);
    let first: Vec<&str> = lines.lines().collect();
    assert_eq!(first[0].trim_start(), "1 -> '<s>'", "{lines}");
    assert_eq!(first[1].trim_start(), "15043 -> ' Hello'", "{lines}");
    // Special-token text: one token when parsed, plain text with --no-parse-special.
    let parsed: Vec<u64> = serde_json::from_str(&run(&["tokenize", "-m", &vocab("qwen2"), "--ids", "<|im_start|>"])).unwrap();
    let plain: Vec<u64> = serde_json::from_str(&run(&["tokenize", "-m", &vocab("qwen2"), "--ids", "--no-parse-special", "<|im_start|>"])).unwrap();
    assert_eq!(parsed.len(), 1);
    assert!(plain.len() > 1, "{plain:?}");
    assert_usage_error(&["tokenize", "-m", &vocab("qwen2")], "PROMPT");
}

/// `flint template` prints exactly transformers' rendering (a real template from
/// ../shared/golden/chat-templates), exactly the golden qwen prompt with `-m`, and exits 2
/// with the template's own message where it refuses.
#[test]
fn template_prints_the_rendered_prompt() {
    let dir = shared().join("golden/chat-templates");
    let cases = json_file("golden/chat-templates/cases.json");
    let case = |t: &str, c: &str| cases["cases"].as_array().unwrap().iter().find(|x| x["template"] == t && x["case"] == c).unwrap().clone();
    let tmp = std::env::temp_dir().join(format!("flint-template-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let write = |name: &str, v: &Value| {
        let p = tmp.join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p.to_str().unwrap().to_string()
    };
    let gemma2 = dir.join("google-gemma-2-2b-it.jinja").to_str().unwrap().to_string();

    let multi = case("mistralai-Mistral-Nemo-Instruct-2407.jinja", "multi_turn");
    let messages = write("multi.json", &multi["messages"]);
    let template = dir.join("mistralai-Mistral-Nemo-Instruct-2407.jinja").to_str().unwrap().to_string();
    let out = flint(&["template", "-f", &template, "--messages", &messages, "--bos-token", "<s>", "--eos-token", "</s>"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), multi["expected"].as_str().unwrap());

    let qwen6 = shared().join("golden/prompts/chat_messages_qwen6.json");
    let out = flint(&["template", "-m", &model_path("qwen2.5-coder-0.5b"), "--messages", qwen6.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), std::fs::read_to_string(shared().join("golden/prompts/p6q.txt")).unwrap());

    let refused = case("google-gemma-2-2b-it.jinja", "system_user");
    let messages = write("system.json", &refused["messages"]);
    assert_usage_error(&["template", "-f", &gemma2, "--messages", &messages], "System role not supported");
    assert_usage_error(&["template", "-m", &model_path("gemma-3-270m"), "--messages", &messages], "no chat template");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// `bytes` with the first GGUF string `name` (u64 length + bytes) found; the offset just past it.
fn after_gguf_string(bytes: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle).unwrap_or_else(|| panic!("{name} not in the file"));
    at + needle.len()
}

/// Malformed files of the new families, made from the oracle's own: a tensor renamed (so one is
/// missing and another unused), a tensor of the wrong shape, a head count that does not divide
/// into the KV heads. Each is refused before any work with one line and exit 2.
#[test]
fn malformed_family_files_exit_2() {
    let dir = std::env::temp_dir().join(format!("flint-families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // qwen3 then lacks a tensor it needs; llama3 lacks its (optional) factors and holds a tensor
    // nothing reads, which is refused too.
    let renamed_error = [
        ("qwen3", "\"blk.0.attn_q_norm.weight\" is missing"),
        ("llama3", "\"rope_freqs.wEight\" is not used"),
        ("phi3", "\"blk.0.attn_qkv.weight\" is missing"),
        ("gemma2", "\"blk.0.post_attention_norm.weight\" is missing"),
        ("qwen3moe", "\"blk.0.ffn_gate_inp.weight\" is missing"),
    ];
    for (family, norm, first_dim) in [
        ("qwen3", "blk.0.attn_q_norm.weight", 32u64),
        ("llama3", "rope_freqs.weight", 16),
        ("phi3", "blk.0.attn_qkv.weight", 128),
        ("gemma2", "blk.0.post_attention_norm.weight", 64),
        ("qwen3moe", "blk.0.ffn_gate_inp.weight", 64),
    ] {
        let good = std::fs::read(shared().join(format!("golden/families/{family}/model.gguf"))).unwrap();
        let write = |tag: &str, bytes: &[u8]| {
            let p = dir.join(format!("{family}-{tag}.gguf"));
            std::fs::write(&p, bytes).unwrap();
            p.to_str().unwrap().to_string()
        };
        // Renamed: same length, so every offset stays valid.
        let mut renamed = good.clone();
        let at = after_gguf_string(&renamed, norm) - ".weight".len();
        renamed[at..at + 7].copy_from_slice(b".wEight");
        let expected = renamed_error.iter().find(|(f, _)| *f == family).unwrap().1;
        assert_usage_error(&["run", "-m", &write("renamed", &renamed), "--backend", "cpu", "hi"], expected);
        // The tensor's first dimension halved: n_dims (u32), then dims (u64 each).
        let mut shape = good.clone();
        let at = after_gguf_string(&shape, norm) + 4;
        assert_eq!(u64::from_le_bytes(shape[at..at + 8].try_into().unwrap()), first_dim);
        shape[at..at + 8].copy_from_slice(&(first_dim / 2).to_le_bytes());
        assert_usage_error(&["run", "-m", &write("shape", &shape), "--backend", "cpu", "hi"], "has shape");
        // 3 query heads over 2 KV heads: the value after the key and its type (u32).
        let arch = if family == "llama3" { "llama" } else { family };
        let mut heads = good.clone();
        let at = after_gguf_string(&heads, &format!("{arch}.attention.head_count")) + 4;
        heads[at..at + 4].copy_from_slice(&3u32.to_le_bytes());
        assert_usage_error(&["run", "-m", &write("heads", &heads), "--backend", "cpu", "hi"], "not a multiple");
        if family == "phi3" {
            // LongRoPE's long factors of the wrong shape (a matrix renamed to them, same length).
            let mut long = good.clone();
            let at = after_gguf_string(&long, "blk.0.attn_output.weight") - 24;
            long[at..at + 24].copy_from_slice(b"rope_factors_long.weight");
            assert_usage_error(&["run", "-m", &write("longrope", &long), "--backend", "cpu", "hi"], "\"rope_factors_long.weight\" has shape");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `flint devices` (and `flint --list-devices`) lists every adapter with the index `--device`
/// takes; `-dev/--device` runs the model on the adapter named by index or by a
/// case-insensitive name substring (with lavapipe and SwiftShader both installed, bench's
/// report names the one used); an unknown name exits 2 with one line. Several devices split
/// the model (the same text as one device; bench compares the two), and bad split flags or
/// budgets too small exit 2 with one line.
#[test]
fn devices_are_listed_and_chosen() {
    if flint_gpu::testing::context().is_none() {
        return;
    }
    let icds = flint_gpu::testing::lavapipe_and_swiftshader_icds();
    let model = shared().join("golden/families/qwen3/model.gguf");
    let m = model.to_str().unwrap();
    let flint_on = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_flint")).args(args).env("VK_ICD_FILENAMES", &icds).output().unwrap();
    let listed = flint_on(&["devices"]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    let text = String::from_utf8(listed.stdout).unwrap();
    assert_eq!(text, String::from_utf8(flint_on(&["--list-devices"]).stdout).unwrap());
    let index = |name: &str| {
        text.lines()
            .find(|l| l.contains(name) && !l.starts_with(' '))
            .and_then(|l| l.split(':').next())
            .unwrap_or_else(|| panic!("{name} is not listed:\n{text}"))
            .to_string()
    };
    let (swiftshader, lavapipe) = (index("SwiftShader"), index("llvmpipe"));
    assert_ne!(swiftshader, lavapipe);
    assert!(text.contains("max storage binding"), "{text}");
    // Subgroups and tensor cores (cooperative matrices), as issue 35 asks the H200 to list.
    assert!(text.contains("subgroups ") && text.contains("cooperative matrices "), "{text}");
    for (dev, want) in [(swiftshader.as_str(), "SwiftShader"), ("LLVMPIPE", "llvmpipe"), (lavapipe.as_str(), "llvmpipe")] {
        let out = flint_on(&["bench", "-m", m, "-dev", dev, "-p", "8", "-n", "2", "--reps", "1", "--format", "json"]);
        assert!(out.status.success(), "--device {dev}: {}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(report["adapter"].as_str().unwrap().contains(want), "--device {dev} ran on {}", report["adapter"]);
    }
    // At a depth (llama-bench's -d) the timed prompt continues one the prefix cache holds:
    // only the -p tokens past its last full block are prefilled.
    let out = flint_on(&["bench", "-m", m, "-dev", &lavapipe, "-d", "32", "-p", "8", "-n", "4", "--reps", "1", "--format", "json"]);
    assert!(out.status.success(), "-d 32: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["depth"].as_u64(), report["prefilled_tokens"].as_u64()), (Some(32), Some(8)), "{report}");
    assert!(report["prefill_tok_s"]["median"].as_f64().unwrap() > 0.0, "{report}");
    // The decode steps overlapped, and the run loop's time on them is reported per step.
    let overlap = &report["overlap"];
    assert!(overlap["steps"].as_u64().unwrap() >= 2 && overlap["submit_ms_per_step"].as_f64().unwrap() > 0.0, "{report}");
    // Steps of at most 3 tokens (llama-bench's -ub): the 8-token prompt prefills in three, and
    // the profile times a prompt step of 3 and decode steps of 1 and 3 sequences (the engine
    // refuses longer ones).
    let out = flint_on(&["bench", "-m", m, "-dev", &lavapipe, "-p", "8", "-n", "2", "--reps", "1", "--max-batch-tokens", "3", "--profile", "--format", "json"]);
    assert!(out.status.success(), "--max-batch-tokens 3: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["max_batch_tokens"].as_u64(), Some(3), "{report}");
    assert!(report["prefill_tok_s"]["median"].as_f64().unwrap() > 0.0 && report["prefill_profile_us"].is_array(), "{report}");
    let sizes: Vec<u64> = report["decode_profile_us"].as_array().unwrap().iter().map(|p| p["sequences"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [1, 3], "{report}");
    // Several streams: each level's decode, and its steps overlapped too.
    let out = flint_on(&["bench", "-m", m, "-dev", &lavapipe, "-p", "8", "-n", "4", "--reps", "1", "--concurrency", "2", "--format", "json"]);
    assert!(out.status.success(), "--concurrency 2: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let two = &report["concurrency"][1];
    assert_eq!(two["concurrency"].as_u64(), Some(2), "{report}");
    assert!(two["steady_decode_tok_s"]["median"].as_f64().unwrap() > 0.0 && two["overlap"]["steps"].as_u64().unwrap() >= 2, "{report}");
    let out = flint_on(&["run", "-m", m, "--device", "no-such-gpu", "--raw", "-n", "1", "hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no GPU adapter found matching \"no-such-gpu\"") && stderr.contains("SwiftShader"), "{stderr}");

    // Several devices split the layers: the same greedy text as one device, over both
    // adapters and over lavapipe twice in 2:1 proportions.
    let text_on = |dev: &str, extra: &[&str]| {
        let args = [&["run", "-m", m, "-dev", dev, "--raw", "-n", "8", "--temp", "0"][..], extra, &["hello"]].concat();
        let out = flint_on(&args);
        assert!(out.status.success(), "--device {dev} {extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let whole = text_on(&lavapipe, &[]);
    assert_eq!(text_on(&format!("{swiftshader},{lavapipe}"), &[]), whole, "split over SwiftShader and lavapipe");
    assert_eq!(text_on(&format!("{lavapipe},{lavapipe}"), &["-ts", "2,1"]), whole, "split 2:1 over lavapipe twice");
    assert_eq!(text_on(&format!("{lavapipe},{swiftshader}"), &["-sm", "none"]), whole, "-sm none: the first device alone");
    // bench measures the split against the first device alone.
    let two = format!("{lavapipe},{lavapipe}");
    // Decode over 7 token intervals: with one, two tokens that arrive together measured a
    // one-device decode of 1.5 million tok/s (a decode ratio of 0.00).
    let out = flint_on(&["bench", "-m", m, "-dev", &two, "-p", "8", "-n", "8", "--reps", "1", "--format", "json"]);
    assert!(out.status.success(), "bench -dev {two}: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let split = &report["split"];
    assert_eq!(split["parts"].as_array().map(Vec::len), Some(2), "{report}");
    assert!(split["decode_ratio"].as_f64().unwrap() > 0.0 && split["one_device_decode_tok_s"]["median"].as_f64().unwrap() > 0.0, "{report}");
    assert!(split["boundary_copy_ms_decode_row"][0].as_f64().unwrap() > 0.0, "{report}");

    assert_usage_error(&["run", "-m", m, "-ts", "1", "hi"], "--tensor-split needs several devices");
    assert_usage_error(&["run", "-m", m, "-dev", "0,0", "-ts", "1", "hi"], "needs 2 non-negative proportions");
    assert_usage_error(&["run", "-m", m, "-dev", "0,0", "--device-mem-mb", "64", "hi"], "needs 2 budgets");
    assert_usage_error(&["run", "-m", m, "-dev", "0,0", "--device-mem-mb", "1,1", "--raw", "hi"], "does not fit the devices' budgets");
}

/// `-j`, `-jf` and `--grammar` hold the reply (the tiny random qwen3: valid whatever it draws);
/// a schema that is not JSON, one that does not compile, a grammar that does not convert and
/// two constraints at once exit 2 with one line.
#[test]
fn constrained_runs_hold_the_reply_and_bad_constraints_exit_2() {
    let model = shared().join("golden/families/qwen3/model.gguf");
    let m = model.to_str().unwrap();
    let schema = r#"{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer","minimum":0,"maximum":9}},"required":["ok","n"],"additionalProperties":false}"#;
    let file = std::env::temp_dir().join(format!("flint-cli-schema-{}.json", std::process::id()));
    std::fs::write(&file, schema).unwrap();
    for args in [vec!["-j", schema], vec!["-jf", file.to_str().unwrap()]] {
        let out = flint(&[&["run", "-m", m, "-n", "200", "--seed", "5"], &args[..], &["Answer:"]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{args:?}: {text:?}: {e}"));
        assert!(v["ok"].is_boolean() && v["n"].as_u64().is_some_and(|n| n <= 9) && v.as_object().unwrap().len() == 2, "{v}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("[stop]"), "a complete grammar ends the reply with stop");
    }
    let out = flint(&["run", "-m", m, "-n", "50", "--seed", "1", "--grammar", r#"root ::= ("yes" | "no") "!""#, "Answer:"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(["yes!", "no!"].contains(&text.trim()), "{text:?}");
    std::fs::remove_file(&file).unwrap();
    assert_usage_error(&["run", "-m", m, "-j", "{not json", "hi"], "--json-schema");
    assert_usage_error(&["run", "-m", m, "-j", r#"{"type":"array","uniqueItems":true}"#, "hi"], "uniqueItems");
    assert_usage_error(&["run", "-m", m, "--grammar", r#"root ::= "a"#, "hi"], "not closed");
    assert_usage_error(&["run", "-m", m, "-jf", "/nonexistent/schema.json", "hi"], "schema.json");
    assert_usage_error(&["run", "-m", m, "-j", "{}", "--grammar", "start: \"a\"", "hi"], "--grammar");
}
